"""Apache/Nginx Combined (and Common) Log Format lines."""

from __future__ import annotations

import re
from dataclasses import dataclass

from svc_ingest.rejection import RecordRejected

# host ident authuser [time] "request" status bytes ["referer" "agent"] [request_time]
_LINE = re.compile(
    r'(?P<client>\S+) \S+ \S+ \[(?P<time>[^\]]+)\] "(?P<request>(?:[^"\\]|\\.)*)" '
    r"(?P<status>\d{3}) (?P<bytes>\d+|-)"
    r'(?: "(?P<referer>(?:[^"\\]|\\.)*)" "(?P<agent>(?:[^"\\]|\\.)*)")?'
    r"(?: (?P<request_time>\d+(?:\.\d+)?))?\s*"
)


@dataclass(frozen=True, slots=True)
class AccessLogLine:
    client_address: str
    time: str
    request: str
    status: int
    response_bytes: int
    referer: str
    user_agent: str
    # Nginx's $request_time (seconds) when the line ends with it; else None.
    request_time_s: float | None


def parse_line(line: str) -> AccessLogLine:
    """One log line; raises RecordRejected(``malformed_log_line``)."""
    match = _LINE.fullmatch(line)
    if match is None:
        shown = line if len(line) <= 120 else line[:117] + "..."
        raise RecordRejected("malformed_log_line", f"not a Combined Log Format line: {shown!r}")
    size = match["bytes"]
    request_time = match["request_time"]
    return AccessLogLine(
        client_address=match["client"],
        time=match["time"],
        request=_unescape(match["request"]),
        status=int(match["status"]),
        response_bytes=0 if size == "-" else int(size),
        referer=_dash(_unescape(match["referer"] or "")),
        user_agent=_dash(_unescape(match["agent"] or "")),
        request_time_s=float(request_time) if request_time else None,
    )


def _unescape(text: str) -> str:
    return text.replace('\\"', '"').replace("\\\\", "\\") if "\\" in text else text


def _dash(text: str) -> str:
    return "" if text == "-" else text
