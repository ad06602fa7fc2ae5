"""sloguard: interference detection and SLO guardrails for co-located Kubernetes nodes."""

__version__ = "0.1.0"
