"""The line between a Spark-launched DDP trial's ranks and its driver.

Rank 0 of a ``launcher: spark`` trial runs in a Spark task, on whichever
executor Spark picked; the trial's ``Channel`` lives in the driver (the
trainer's executor process). ``ProgressServer`` listens on the driver's
address for the run; rank 0's ``DriverChannel`` connects to it and sends one
JSON line per ``started`` / ``epoch`` and per stop check, and each line is
answered with the real channel's ``stop_requested()``, so the tuner sees
every epoch and a prune or shutdown reaches the ranks as under ``ddp``. A
rank that fails says why on a connection of its own (``report_failure``), so
the driver can name the rank and its error rather than Spark's job failure.

Every connection starts with the run's token: a stray or stale client (a
rank of an earlier run) is dropped unheard. No torch, no Spark here.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from shared.log import get_logger
from svc_trainer.plan import Channel, StopReason

log = get_logger("svc_trainer")

#: How long a rank waits to connect to, or hear back from, the driver.
DRIVER_TIMEOUT_S = 60.0
#: How often the driver checks in for the ranks while Spark launches them.
LAUNCH_CHECK_S = 1.0


@dataclass(frozen=True)
class DriverAddress:
    """Where a run's ranks reach its driver; picklable, travels with the ranks."""

    host: str
    port: int
    token: str


@dataclass(frozen=True)
class RankFailure:
    """What a failed rank said about itself."""

    rank: int
    error: str  # the exception's type name
    message: str
    reason: str = ""  # a TrialError's reason; "" for anything else
    retryable: bool = False  # a TrialError's
    traceback: str = ""  # its last lines

    def line(self) -> str:
        return f"rank {self.rank} failed: {self.error}: {self.message}"


class ProgressServer:
    """The driver's end: forwards rank 0's reports to ``channel`` (one
    thread at a time) and keeps the first failure a rank reported. A context
    manager: it listens from ``__enter__`` until ``__exit__``.

    Until rank 0 says it started, the server asks ``channel`` itself every
    ``launch_check_s``: Spark is still getting executors and the ranks are
    starting their processes (importing the framework, joining the
    collective), tens of seconds on a cluster, and the trainer's stall watch
    must not take that for a loop of the user's that stopped checking in.
    From ``started`` on, only the ranks' own checks count."""

    def __init__(
        self, host: str, channel: Channel, *, launch_check_s: float = LAUNCH_CHECK_S
    ) -> None:
        self._channel = channel
        self._lock = threading.Lock()
        self._listener = socket.create_server((host, 0))
        self.address = DriverAddress(host, self._listener.getsockname()[1], secrets.token_hex(16))
        self.failure: RankFailure | None = None
        self._closed = threading.Event()
        self._started = threading.Event()
        self._launch_check_s = launch_check_s
        self._accepting = threading.Thread(target=self._accept, name="spark-progress", daemon=True)
        self._launching = threading.Thread(
            target=self._check_in_while_launching, name="spark-launch", daemon=True
        )

    def __enter__(self) -> ProgressServer:
        self._accepting.start()
        self._launching.start()
        return self

    def _check_in_while_launching(self) -> None:
        while not self._started.is_set() and not self._closed.wait(self._launch_check_s):
            with self._lock:
                if not self._started.is_set():
                    self._channel.stop_requested()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._closed.set()
        # shutdown() wakes the blocked accept(); close() alone may not.
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._accepting.join(timeout=5)
        if self._launching.is_alive():
            self._launching.join(timeout=5)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(
                target=self._serve, args=(conn,), name="spark-progress-rank", daemon=True
            ).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn, conn.makefile("rwb") as stream:
                hello = _read(stream)
                if hello is None or not secrets.compare_digest(
                    str(hello.get("token", "")), self.address.token
                ):
                    log.warning("spark.progress_refused")
                    return
                _write(stream, {"ok": True})
                while (message := _read(stream)) is not None:
                    _write(stream, {"stop": int(self._handle(message))})
        except (OSError, ValueError, KeyError, TypeError) as exc:
            # The rank sees the connection drop and fails with it.
            log.warning("spark.progress_dropped", error=f"{type(exc).__name__}: {exc}")

    def _handle(self, message: Mapping[str, Any]) -> StopReason:
        with self._lock:
            event = message.get("event")
            if event == "started":
                self._started.set()
                self._channel.started(int(message["resumed_from_step"]), str(message["note"]))
            elif event == "epoch":
                metrics = {str(k): float(v) for k, v in message["metrics"].items()}
                self._channel.epoch(int(message["step"]), metrics)
            elif event == "failed" and self.failure is None:
                # The first failure is the cause; the other ranks' follow
                # from it (a peer gone mid-collective).
                self.failure = RankFailure(
                    int(message["rank"]),
                    str(message["error"]),
                    str(message["message"]),
                    str(message.get("reason", "")),
                    bool(message.get("retryable", False)),
                    str(message.get("traceback", "")),
                )
            return self._channel.stop_requested()


class DriverChannel:
    """Rank 0's ``Channel``: every call is one line to the driver and its
    answer, the driver channel's ``stop_requested()``. Connects on first use."""

    def __init__(self, address: DriverAddress, timeout: float = DRIVER_TIMEOUT_S) -> None:
        self._address = address
        self._timeout = timeout
        self._stream: Any = None

    def started(self, resumed_from_step: int, note: str = "") -> None:
        self._ask({"event": "started", "resumed_from_step": resumed_from_step, "note": note})

    def epoch(self, step: int, metrics: Mapping[str, float]) -> None:
        self._ask({"event": "epoch", "step": step, "metrics": dict(metrics)})

    def stop_requested(self) -> StopReason:
        return self._ask({"event": "ask"})

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def _ask(self, message: Mapping[str, Any]) -> StopReason:
        if self._stream is None:
            self._stream = _connect(self._address, self._timeout)
        _write(self._stream, message)
        answer = _read(self._stream)
        if answer is None:
            raise ConnectionError(f"the driver at {self._address.host} closed the connection")
        return StopReason(int(answer["stop"]))


def report_failure(address: DriverAddress, failure: RankFailure, timeout: float = 10.0) -> None:
    """Tell the driver why this rank failed; best effort (the rank fails
    anyway, and Spark reports that much)."""
    try:
        with _connect(address, timeout) as stream:
            _write(
                stream,
                {
                    "event": "failed",
                    "rank": failure.rank,
                    "error": failure.error,
                    "message": failure.message,
                    "reason": failure.reason,
                    "retryable": failure.retryable,
                    "traceback": failure.traceback,
                },
            )
            _read(stream)
    except OSError as exc:
        log.warning("spark.failure_not_reported", rank=failure.rank, error=str(exc))


def _connect(address: DriverAddress, timeout: float) -> Any:
    conn = socket.create_connection((address.host, address.port), timeout=timeout)
    stream = conn.makefile("rwb")
    # The file holds its own reference: closing it closes the socket.
    conn.close()
    _write(stream, {"token": address.token})
    if _read(stream) is None:
        stream.close()
        raise ConnectionError(f"the driver at {address.host}:{address.port} refused this run")
    return stream


def _write(stream: Any, message: Mapping[str, Any]) -> None:
    stream.write(json.dumps(message).encode() + b"\n")
    stream.flush()


def _read(stream: Any) -> dict[str, Any] | None:
    line = stream.readline()
    if not line:
        return None
    parsed: dict[str, Any] = json.loads(line)
    return parsed
