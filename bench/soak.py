"""A soak: the whole stack under steady load for a long while, its memory and lag watched.

``python -m bench.soak --minutes 30 [--rate 2000]`` starts a stack of its own
(on free ports, in a throw-away state directory), sends raw sensor readings
at ``--rate`` a second, runs a digits study through the trainers and, once
its first model serves, asks svc_model for predictions about ten times a
second. It samples each service's resident memory (its whole process group:
Spark's JVM for svc_transform, the executors of a trainer) and the consumer
lag every service exports (``aistack_consumer_lag``, summed per service),
and prints them over time.

Goals: no service's memory grows more than 20% from the end of the warm-up
to the end (``soak_memory_growth``: 1.2 over the largest end/start ratio),
and the lag stays bounded (``soak_lag_bounded``: the first half's peak lag,
at least the rate, over the second half's; below 1 means it kept growing).
Both are aistack against its own goals, not a peer.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from aistack.studies import load_spec
from bench import profiling
from bench.harness import print_ratio
from bench.recovery import SteadyLoad
from compose.settings import StackSettings
from compose.stack import ServiceStack
from shared.metrics import scraped_sum

STUDY = """
name: soak-digits
objective: {metric: val_error, direction: DIRECTION_MINIMIZE}
params:
  - name: learning_rate
    float_range: {low: 0.001, high: 0.05, log: true}
sampler: {kind: SAMPLER_KIND_TPE}
pruner: {kind: PRUNER_KIND_NONE}
budget: {max_trials: 1000, max_parallel: 2, time_limit: 86400s, trial_timeout: 600s}
task:
  dataset: digits
  model_family: mlp
  framework: FRAMEWORK_TORCH
  strategy: single
  epochs: 3
  model_name: soak-digits
seed: 1
"""

#: The most a service's memory may grow after the warm-up.
MEMORY_GOAL = 1.2


def group_rss_bytes(pgid: int) -> int:
    """Resident memory of every process in the process group ``pgid``."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid:  # the fields after the name: state, ppid, pgrp
                continue
            for line in (entry / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
    return total


def memory(stack: ServiceStack) -> dict[str, int]:
    return {s.name: group_rss_bytes(s.pid) for s in stack.status() if s.pid is not None}


def lag(stack: ServiceStack) -> dict[str, float]:
    """Each service's consumer lag, summed over what it reads."""
    found: dict[str, float] = {}
    for use in stack.settings.ports():
        if use.role == "metrics":
            found[use.service] = scraped_sum(use.port, "aistack_consumer_lag")
    return found


class Predictions:
    """About ten predictions a second of the study's serving model, once there is one."""

    def __init__(self, stack: ServiceStack) -> None:
        self._stack = stack
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.answered = 0
        self.refused = 0

    def __enter__(self) -> Predictions:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        import grpc

        from shared.contracts.inference import grpc_predict_v2_pb2 as pb
        from shared.contracts.inference import grpc_predict_v2_pb2_grpc as pb_grpc
        from svc_trainer.data.datasets import load

        x = np.asarray(load("digits", {}, seed=0).x_test[:1], dtype=np.float32)
        request = pb.ModelInferRequest(model_name="soak-digits")
        tensor = request.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
        tensor.contents.fp32_contents.extend(x.ravel().tolist())
        with self._stack.model().open_sync() as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
            while not self._stop.wait(0.1):
                try:
                    stub.ModelInfer(request, timeout=10)
                    self.answered += 1
                except grpc.RpcError:
                    self.refused += 1  # no model yet, or a retryable refusal


def start_study(stack: ServiceStack) -> str:
    from shared.contracts.aistack.v1 import tuner_service_pb2 as api
    from shared.contracts.aistack.v1.tuner_service_pb2_grpc import TunerServiceStub

    with stack.tuner().open_sync() as channel:
        stub = TunerServiceStub(channel)  # type: ignore[no-untyped-call]
        created = stub.CreateStudy(api.CreateStudyRequest(spec=load_spec(STUDY)))
    return str(created.study.study_id)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=30.0, help="how long, after warm-up")
    parser.add_argument("--rate", type=int, default=2000, help="raw events a second")
    # Memory grows by design until svc_ingest's dedup window (600 s) is full
    # and the study's first models are loaded: measure from past that.
    parser.add_argument("--warm-up", type=float, default=660.0, help="seconds before measuring")
    parser.add_argument("--every", type=float, default=60.0, help="seconds between samples")
    profiling.add_flag(parser, "soak")
    args = parser.parse_args()

    state = Path(tempfile.mkdtemp(prefix="bench-soak-"))
    stack = ServiceStack(StackSettings.on_free_ports(state))
    print(f"starting a stack in {state} …", flush=True)
    stack.up()
    lags: list[tuple[float, dict[str, float]]] = []
    try:
        with SteadyLoad(stack, args.rate) as load, Predictions(stack) as predictions:
            study = start_study(stack)
            print(f"study {study} running; warming up {args.warm_up:.0f} s", flush=True)
            time.sleep(args.warm_up)
            start = memory(stack)
            began = time.monotonic()
            while (elapsed := time.monotonic() - began) < args.minutes * 60:
                time.sleep(min(args.every, args.minutes * 60 - elapsed))
                sample = lag(stack)
                lags.append((time.monotonic() - began, sample))
                shown = ", ".join(f"{name} {value:.0f}" for name, value in sample.items() if value)
                print(f"t+{lags[-1][0]:5.0f}s lag: {shown or '0 in every service'}", flush=True)
            end = memory(stack)
            print(
                f"{load.sent} raw events at {args.rate}/s; predictions: "
                f"{predictions.answered} answered, {predictions.refused} refused"
            )
    finally:
        stack.down()

    print(f"{'service':<14} {'rss start':>10} {'rss end':>10} {'growth':>7}")
    growth = 0.0
    for name, before in start.items():
        after = end.get(name, 0)
        ratio = after / before if before else 0.0
        growth = max(growth, ratio)
        print(f"{name:<14} {before / 2**20:9.0f}M {after / 2**20:9.0f}M {ratio:6.2f}x")
    half = len(lags) // 2
    first = max((sum(s.values()) for _, s in lags[:half]), default=0.0)
    second = max((sum(s.values()) for _, s in lags[half:]), default=0.0)
    print_ratio("soak_memory_growth", MEMORY_GOAL / growth if growth else 0.0, 1.0, itself=True)
    print_ratio("soak_lag_bounded", max(first, args.rate) / max(second, 1.0), 1.0, itself=True)


if __name__ == "__main__":
    main()
