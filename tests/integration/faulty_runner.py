"""A runner that takes its executor down the ways real trials do, registered
with ``AISTACK_TRAINER_RUNNERS`` by the tests that need one.

``task.options["fault"]`` picks the way: ``exit`` (a model calling
``os._exit``), ``segfault`` (a native crash), ``oom_kill`` (what the kernel's
out-of-memory killer does: SIGKILL), ``hang`` (a collective that never
returns: no check, no report), ``refuse`` (a configuration error that names
the executor's pid, and leaves it alive)."""

from __future__ import annotations

import ctypes
import os
import signal
import threading

from svc_trainer.plan import Channel, DataSplits, RunResult, RunSpec, TrialError


class FaultyRunner:
    name = "faulty"

    def warm_up(self, threads: int) -> None:
        pass

    def fresh_process(self, spec: RunSpec) -> bool:
        return False

    def run(self, spec: RunSpec, data: DataSplits, channel: Channel) -> RunResult:
        channel.started(0)
        fault = spec.options.get("fault", "")
        if fault == "exit":
            os._exit(3)
        if fault == "segfault":
            ctypes.string_at(0)
        if fault == "oom_kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if fault == "hang":
            threading.Event().wait()
        raise TrialError(f"refused in executor pid {os.getpid()}", reason="invalid_params")

    def release(self) -> None:
        pass


RUNNER = FaultyRunner()
