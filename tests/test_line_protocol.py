"""InfluxDB line protocol as the receive endpoint parses it: escaping, types, precision, and
errors that name the line and column."""

from __future__ import annotations

import pytest

from sloguard.ui.line_protocol import LineProtocolError, parse_lines


def test_escaping_types_and_precision():
    body = (
        "# a comment, then a blank line\n\n"
        'app\\ latency\\,x,service=web\\ shop,path=/a\\=b\\,c p99=12.5,requests=10i,big=7u,'
        'ok=t,bad=FALSE,msg="say \\"hi\\" \\\\ bye",neg=-1.5e3 1700000000\r\n'
        "m,t=v f=1\n"
    )
    first, second = parse_lines(body, precision="s")
    assert first.measurement == "app latency,x"
    assert first.tags == {"service": "web shop", "path": "/a=b,c"}
    assert first.fields == {"p99": 12.5, "requests": 10, "big": 7, "ok": True, "bad": False,
                            "msg": 'say "hi" \\ bye', "neg": -1500.0}
    assert first.time_ns == 1_700_000_000 * 10**9 and first.line == 3
    assert second.time_ns is None and second.line == 4
    assert parse_lines("m f=1 5", precision="ms")[0].time_ns == 5_000_000
    assert parse_lines("m f=1 5", precision="us")[0].time_ns == 5_000
    assert parse_lines('m s="a,b c=d" 1')[0].fields == {"s": "a,b c=d"}


@pytest.mark.parametrize("line, message", [
    ("m", "line 1, column 2: no fields"),
    ("m f", "got 'f' without a value"),
    ("m,t f=1", "expected tag key=value, got 't' without a value"),
    ("m f=1x", "'1x' is not a number"),
    ("m f=1_0", "'1_0' is not a number"),
    ("m f=nan", "'nan' is not a number"),
    ("m f=-1u", "'-1u' is not a number"),
    ("m f=1 12a", "timestamp must be an integer"),
    ("m,t=a=b f=1", "unescaped '='"),
    ('m f="open', "unterminated string"),
    ("m,t= f=1", "tag 't' has an empty value"),
    (",t=1 f=1", "missing measurement"),
])
def test_mistakes_name_line_and_column(line, message):
    with pytest.raises(LineProtocolError, match=message):
        parse_lines(f"ok f=1\n{line}" if "line 1" not in message else line)


def test_bad_line_number_is_reported_and_nothing_is_kept():
    with pytest.raises(LineProtocolError, match=r"^line 3, column 5: field 'f'"):
        parse_lines("a f=1\nb f=2\nc f=oops\nd f=4\n")
    with pytest.raises(LineProtocolError, match="precision"):
        parse_lines("a f=1", precision="h")
