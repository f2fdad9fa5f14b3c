"""How long each service takes to be back after a kill -9, on the whole stack under load.

``python -m bench.recovery [--rate 300] [--rounds 1]`` starts a stack of its
own (``aistack up``, on free ports, in a throw-away state directory), keeps
a steady stream of raw sensor readings flowing, and kills with SIGKILL, one
after another, svc_ingest, svc_transform, svc_tuner, a trainer, svc_model
and svc_monitor. Each is restarted at once (as a supervisor would) and timed
from the restart to doing its work again:

* svc_ingest: the first clean event committed after the restart;
* svc_transform: the first micro-batch that reads the clean topic again
  (``aistack_transform_rows_in_total`` of the new process);
* svc_tuner: a ``GetStudy`` answered (its studies reloaded from Redis);
* svc_trainer-1: ready (its metrics answer);
* svc_model: serving (it listens once the models topic is replayed);
* svc_monitor: started (its ``aistack_monitor_started`` gauge: the registry,
  the drift events and the windows' tail replayed; its metrics answer before).

One line per service, then ``NAME: ratio R (goal G)`` for svc_ingest's goal
(back within 10 s of its restart): the ratio is 10 s over the time taken,
aistack against its own goal, not a peer.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench import profiling
from bench.harness import print_ratio
from compose.settings import StackSettings
from compose.stack import ServiceStack
from shared.bus.producer import BusProducer
from shared.bus.topics import EVENTS_CLEAN, EVENTS_RAW
from shared.metrics import scraped_sum

#: svc_ingest's goal: clean events flow again this long after its restart.
INGEST_GOAL_SECONDS = 10.0
#: The longest any service is waited for.
PATIENCE_SECONDS = 180.0


@dataclass(frozen=True)
class Back:
    service: str
    seconds: float
    what: str


class SteadyLoad:
    """Raw sensor readings at ``rate`` a second, stamped now, until stopped."""

    def __init__(self, stack: ServiceStack, rate: int) -> None:
        self._producer = BusProducer(stack.client_kafka(), source="bench-recovery")
        self._rate = rate
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.sent = 0

    def __enter__(self) -> SteadyLoad:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._producer.flush()

    def _run(self) -> None:
        tick = 0.1
        per_tick = max(1, int(self._rate * tick))
        while not self._stop.is_set():
            started = time.monotonic()
            now = time.time()
            for _ in range(per_tick):
                device = f"thermo-{self.sent % 200:03d}"
                reading = {
                    "event_id": uuid.uuid4().hex,
                    "device_id": device,
                    "timestamp": round(now, 3),
                    "metrics": {"temperature": {"value": 20 + self.sent % 10, "unit": "C"}},
                }
                self._producer.publish_raw(
                    EVENTS_RAW,
                    json.dumps(reading).encode(),
                    key=device.encode(),
                    headers=[("content-type", b"application/json")],
                )
                self.sent += 1
            self._producer.poll(0)
            self._stop.wait(max(0.0, tick - (time.monotonic() - started)))


def _until(what: str, probe: Callable[[], bool], since: float) -> float:
    while not probe():
        if time.monotonic() - since > PATIENCE_SECONDS:
            raise TimeoutError(f"not back after {PATIENCE_SECONDS:.0f} s: {what}")
        time.sleep(0.05)
    return time.monotonic() - since


def _kill(stack: ServiceStack, name: str) -> None:
    (status,) = [s for s in stack.status() if s.name == name]
    assert status.pid is not None, f"{name} is not running"
    os.killpg(status.pid, signal.SIGKILL)
    while any(s.name == name and s.state == "running" for s in stack.status()):
        time.sleep(0.05)


def _restart(stack: ServiceStack, name: str) -> float:
    """Start ``name`` again in the background; when it was started."""
    started = time.monotonic()
    threading.Thread(target=stack.start_service, args=(name,), daemon=True).start()
    return started


def _first_clean_after(stack: ServiceStack) -> Callable[[], bool]:
    """Whether a clean event was committed after this call (read as an
    assign-only reader, which secure mode lets any client be)."""
    from shared.bus.consumer import BusTail
    from shared.contracts.aistack.v1 import events_pb2

    tail = BusTail(stack.client_kafka(), topics=[EVENTS_CLEAN], message_cls=events_pb2.CleanEvent)

    def arrived() -> bool:
        if tail.poll_batch(100, timeout=0.2):
            tail.close()
            return True
        return False

    return arrived


def ingest(stack: ServiceStack) -> Back:
    _kill(stack, "svc_ingest")
    arrived = _first_clean_after(stack)
    since = _restart(stack, "svc_ingest")
    return Back("svc_ingest", _until("a clean event", arrived, since), "first clean event")


def transform(stack: ServiceStack) -> Back:
    port = stack.settings.transform_metrics_port
    _kill(stack, "svc_transform")
    since = _restart(stack, "svc_transform")

    def reading() -> bool:
        return scraped_sum(port, "aistack_transform_rows_in_total") > 0

    return Back("svc_transform", _until("a micro-batch", reading, since), "first micro-batch")


def tuner(stack: ServiceStack) -> Back:
    import grpc

    from shared.contracts.aistack.v1 import tuner_service_pb2 as api
    from shared.contracts.aistack.v1.tuner_service_pb2_grpc import TunerServiceStub

    _kill(stack, "svc_tuner")
    since = _restart(stack, "svc_tuner")

    def answers() -> bool:
        try:
            with stack.tuner().open_sync() as channel:
                stub = TunerServiceStub(channel)  # type: ignore[no-untyped-call]
                stub.GetStudy(api.GetStudyRequest(study_id="bench-none"), timeout=2)
        except grpc.RpcError as exc:
            return bool(exc.code() == grpc.StatusCode.NOT_FOUND)
        return True

    return Back("svc_tuner", _until("GetStudy", answers, since), "GetStudy answered")


def _metrics_answer(port: int) -> Callable[[], bool]:
    import urllib.request

    def answer() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1):
                return True
        except OSError:
            return False

    return answer


def trainer(stack: ServiceStack) -> Back:
    _kill(stack, "svc_trainer-1")
    since = _restart(stack, "svc_trainer-1")
    ready = _metrics_answer(stack.settings.trainer_metrics_port)
    return Back("svc_trainer-1", _until("ready", ready, since), "ready (metrics)")


def model(stack: ServiceStack) -> Back:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    _kill(stack, "svc_model")
    since = _restart(stack, "svc_model")

    def serving() -> bool:
        try:
            with stack.model().open_sync() as channel:
                health = health_pb2_grpc.HealthStub(channel)
                answer = health.Check(health_pb2.HealthCheckRequest(), timeout=1)
                return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)
        except Exception:
            return False

    return Back("svc_model", _until("serving", serving, since), "serving (registry replayed)")


def monitor(stack: ServiceStack) -> Back:
    port = stack.settings.monitor_metrics_port
    _kill(stack, "svc_monitor")
    since = _restart(stack, "svc_monitor")

    def started() -> bool:
        return scraped_sum(port, "aistack_monitor_started") > 0

    return Back("svc_monitor", _until("started", started, since), "started (topics replayed)")


VICTIMS: tuple[Callable[[ServiceStack], Back], ...] = (
    ingest,
    transform,
    tuner,
    trainer,
    model,
    monitor,
)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.recovery", description=__doc__)
    parser.add_argument("--rate", type=int, default=300, help="raw events a second")
    parser.add_argument("--rounds", type=int, default=1, help="kills of each service")
    parser.add_argument("--warm-up", type=float, default=20.0, help="seconds of load first")
    profiling.add_flag(parser, "recovery")
    args = parser.parse_args()

    state = Path(tempfile.mkdtemp(prefix="bench-recovery-"))
    stack = ServiceStack(StackSettings.on_free_ports(state))
    print(f"starting a stack in {state} …", flush=True)
    stack.up()
    taken: dict[str, list[Back]] = {}
    try:
        with SteadyLoad(stack, args.rate) as load:
            time.sleep(args.warm_up)
            for _ in range(args.rounds):
                for victim in VICTIMS:
                    back = victim(stack)
                    taken.setdefault(back.service, []).append(back)
                    print(f"{back.service:<14} back in {back.seconds:5.1f} s ({back.what})")
                    time.sleep(5)  # the stack settles before the next kill
            print(f"{load.sent} raw events sent at {args.rate}/s")
    finally:
        stack.down()
    worst_ingest = max(b.seconds for b in taken["svc_ingest"])
    print_ratio("ingest_back_within_10s", INGEST_GOAL_SECONDS / worst_ingest, 1.0, itself=True)


if __name__ == "__main__":
    main()
