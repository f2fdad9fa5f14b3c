"""Good web-server access events: JSON access logs, CLF lines, protobuf RawEvent."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from loadgen import timestamps
from loadgen.records import Draft, EventIds, Format, JsonDraft, LogDraft, ProtoDraft
from shared.contracts.aistack.v1 import events_pb2

_HOSTS = tuple(f"web-{n:02d}" for n in range(1, 7))
_USER_AGENTS = (
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/124.0.0.0 Safari/537.36",
    "Mozilla/5.0 (X11; Linux x86_64; rv:125.0) Gecko/20100101 Firefox/125.0",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_4 like Mac OS X) AppleWebKit/605.1.15 "
    "(KHTML, like Gecko) Version/17.4 Mobile/15E148 Safari/604.1",
    "curl/8.5.0",
    "python-requests/2.32.3",
    "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
    "kube-probe/1.30",
)
_REFERERS = (
    "https://example.com/",
    "https://example.com/search?q=widgets",
    "https://www.google.com/",
)
_WORDS = ("widgets", "gadgets", "blue+shoes", "invoice", "kafka")
# (weight, status) for GETs; writes get their own below.
_GET_STATUSES = ((80, 200), (6, 304), (3, 301), (7, 404), (2, 500), (2, 503))


@dataclass(frozen=True)
class Request:
    host: str
    client: str
    moment: datetime
    offset: int
    method: str
    path: str
    protocol: str
    status: int
    size: int
    latency_s: float
    user_agent: str
    referer: str  # "" when none


def _client(rng: random.Random) -> str:
    # Documentation ranges (RFC 5737, RFC 3849): realistic, never a real user.
    if rng.random() < 0.1:
        return f"2001:db8::{rng.randrange(1, 0xFFFF):x}"
    prefix = rng.choice(("192.0.2", "198.51.100", "203.0.113"))
    return f"{prefix}.{rng.randrange(1, 255)}"


def _target(rng: random.Random) -> tuple[str, str]:
    roll = rng.random()
    if roll < 0.55:
        return "GET", rng.choice(
            (
                "/",
                "/index.html",
                f"/api/items/{rng.randrange(1, 5000)}",
                f"/api/items?page={rng.randrange(1, 40)}",
                f"/api/users/{rng.randrange(1, 900)}/orders",
                f"/search?q={rng.choice(_WORDS)}",
                "/healthz",
            )
        )
    if roll < 0.8:
        return "GET", rng.choice(
            (f"/static/js/app.{rng.getrandbits(32):08x}.js", "/static/css/site.css", "/favicon.ico")
        )
    if roll < 0.93:
        return "POST", rng.choice(
            ("/api/items", "/login", f"/api/users/{rng.randrange(1, 900)}/orders")
        )
    if roll < 0.97:
        return "PUT", f"/api/items/{rng.randrange(1, 5000)}"
    if roll < 0.99:
        return "DELETE", f"/api/items/{rng.randrange(1, 5000)}"
    return "HEAD", "/"


def _status(rng: random.Random, method: str) -> int:
    if method == "POST":
        return rng.choices((201, 200, 400, 401, 422, 500), (50, 20, 10, 10, 8, 2))[0]
    if method in ("PUT", "DELETE"):
        return rng.choices((200, 204, 404, 409), (40, 40, 15, 5))[0]
    statuses = [status for _, status in _GET_STATUSES]
    return rng.choices(statuses, [weight for weight, _ in _GET_STATUSES])[0]


def _size(rng: random.Random, status: int, path: str) -> int:
    if status in (204, 304):
        return 0
    median = 180_000 if path.endswith(".js") else 3_000
    return max(1, int(rng.lognormvariate(math.log(median), 0.8)))


class WebSource:
    """Requests to a handful of web hosts, in the ``span_seconds`` before ``now``."""

    def __init__(
        self,
        rng: random.Random,
        now: datetime,
        ids: EventIds,
        *,
        span_seconds: float = timestamps.DEFAULT_SPAN_SECONDS,
    ) -> None:
        self._rng = rng
        self._now = now
        self._ids = ids
        self._span_seconds = span_seconds
        # Log lines carry no id: svc_ingest dedups them by content hash, so two
        # distinct requests must never print the same line.
        self._lines: set[str] = set()

    def request(self) -> Request:
        rng = self._rng
        method, path = _target(rng)
        status = _status(rng, method)
        return Request(
            host=rng.choice(_HOSTS),
            client=_client(rng),
            moment=timestamps.recent(rng, self._now, self._span_seconds),
            offset=timestamps.offset(rng),
            method=method,
            path=path,
            protocol=rng.choices(("HTTP/1.1", "HTTP/2.0", "HTTP/1.0"), (70, 27, 3))[0],
            status=status,
            size=_size(rng, status, path),
            # nginx's $request_time: seconds with millisecond resolution.
            latency_s=round(max(0.001, rng.lognormvariate(math.log(0.02), 1.0)), 3),
            user_agent=rng.choice(_USER_AGENTS),
            referer=rng.choice(_REFERERS) if rng.random() < 0.4 else "",
        )

    def draft(self, fmt: Format, *, structured: bool = False) -> Draft:
        req = self.request()
        if fmt == "log":
            return LogDraft(req.host.encode(), self._unique_line(req))
        if fmt == "protobuf":
            return self._proto(req, structured)
        return self._json(req)

    def _unique_line(self, req: Request) -> str:
        size = req.size
        while True:
            line = clf_line(req, size, with_time=self._rng.random() < 0.6)
            if line not in self._lines:
                self._lines.add(line)
                return line
            size += 1

    def _json(self, req: Request) -> JsonDraft:
        rng = self._rng
        event_id = self._ids.next()
        doc: dict[str, Any] = {
            "event_id": event_id,
            "host": req.host,
            "remote_addr": req.client,
            "time": timestamps.iso(req.moment, req.offset, zulu=rng.random() < 0.3),
        }
        if rng.random() < 0.25:
            doc["request"] = f"{req.method} {req.path} {req.protocol}"
        else:
            doc.update(method=req.method, path=req.path, protocol=req.protocol)
        doc.update(status=req.status, bytes=req.size)
        if rng.random() < 0.5:
            doc["request_time"] = req.latency_s
        else:
            doc["latency_ms"] = round(req.latency_s * 1000, 1)
        doc.update(user_agent=req.user_agent, referer=req.referer)
        return JsonDraft(req.host.encode(), event_id, doc)

    def _proto(self, req: Request, structured: bool) -> ProtoDraft:
        event_id = self._ids.next()
        message = events_pb2.RawEvent(event_id=event_id)
        if not structured and self._rng.random() < 0.15:
            # A log shipper that wraps the line as it was written.
            message.log_line = self._unique_line(req)
            return ProtoDraft(req.host.encode(), event_id, message)
        message.event_time.FromMicroseconds(timestamps.epoch_us(req.moment))
        web = message.web_request
        web.host = req.host
        web.client_address = req.client
        web.method = req.method
        web.path = req.path
        web.protocol = req.protocol
        web.status = req.status
        web.response_bytes = req.size
        web.latency_ms = round(req.latency_s * 1000, 1)
        web.user_agent = req.user_agent
        web.referer = req.referer
        return ProtoDraft(req.host.encode(), event_id, message)


def clf_line(req: Request, size: int, *, with_time: bool) -> str:
    """Combined Log Format, optionally with nginx's ``$request_time`` appended."""
    referer = req.referer or "-"
    line = (
        f"{req.client} - - [{timestamps.clf(req.moment, req.offset)}] "
        f'"{req.method} {req.path} {req.protocol}" {req.status} {size} '
        f'"{referer}" "{req.user_agent}"'
    )
    return f"{line} {req.latency_s:.3f}" if with_time else line
