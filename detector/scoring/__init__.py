"""Scores of detectors on public benchmarks (TCPD now; NAB with issue #3's `sloguard score`)."""
