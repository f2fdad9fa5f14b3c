"""A trial's PyTorch DDP run under torchrun, on one node or many.

The multi-node path for PyTorch goes through torchrun's own rendezvous, not a
scheduler of ours. Every node runs the same command; torchrun sets each
rank's RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT::

    torchrun --nnodes 2 --nproc-per-node 4 \\
        --rdzv-backend c10d --rdzv-endpoint HOST:29400 --rdzv-id STUDY-TRIAL \\
        -m svc_trainer.backends.torch.torchrun trial.json --out s3://bucket/runs/STUDY-TRIAL

``trial.json`` is a ``TrialRequested`` in protobuf JSON (what the tuner
publishes; ``aistack study`` shows them). Rank 0 checkpoints every epoch into
``--out``/checkpoints (uploaded there before the epoch's line when ``--out``
is remote, so a restarted torchrun resumes after the last epoch printed),
prints one JSON line per epoch, and at the end exports the model into
``--out``/model and prints the result with the model's sha256. A trial of
the user's code (``task.model``, ``task.entrypoint``) runs the same way, its
shipped package (``task.code``) fetched and checked by every rank. ``--out`` must
be reachable from every node (shared disk, or any fsspec URL: ``s3://…``,
``ftp://user:password@host/dir``…).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from google.protobuf import json_format

from shared.artifacts import ArtifactStore, digest
from shared.contracts.aistack.v1 import tuning_pb2
from svc_trainer import trials
from svc_trainer.lifetime import die_with_parent
from svc_trainer.plan import StopReason, TrialError

_CHECKPOINTS = "checkpoints"


class _PrintChannel:
    """Rank 0's channel: one JSON line per event on stdout. With a remote
    ``--out`` each epoch's checkpoint is uploaded before its line is printed,
    so a printed epoch is one a restarted torchrun resumes after."""

    def __init__(self, upload: Callable[[], None] | None = None) -> None:
        self._upload = upload

    def started(self, resumed_from_step: int, note: str = "") -> None:
        print(
            json.dumps({"event": "started", "resumed_from_step": resumed_from_step, "note": note})
        )
        sys.stdout.flush()

    def epoch(self, step: int, metrics: Mapping[str, float]) -> None:
        if self._upload is not None:
            self._upload()
        print(json.dumps({"event": "epoch", "step": step, **trials.progress_metrics(metrics)}))
        sys.stdout.flush()

    def stop_requested(self) -> StopReason:
        return StopReason.NONE


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run one trial's DDP under torchrun.")
    parser.add_argument("trial", type=Path, help="a TrialRequested as protobuf JSON")
    parser.add_argument("--out", required=True, help="a directory or fsspec URL")
    parser.add_argument("--features-path", default="")
    parser.add_argument("--mnist-path", default="")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    args = parser.parse_args(argv)
    if "RANK" not in os.environ:
        parser.error("run me under torchrun (RANK, WORLD_SIZE... are not set)")
    # torchrun starts each rank in a session of its own and kills it when it
    # exits cleanly; a torchrun that is killed (its node lost) takes the
    # ranks with it only this way.
    die_with_parent()

    from svc_trainer.backends.torch import ddp as torch_ddp
    from svc_trainer.backends.torch import runner as torch_runner
    from svc_trainer.backends.torch import user_loop
    from svc_trainer.data import datasets
    from svc_trainer.user_code.packages import put_on_path

    request = json_format.Parse(args.trial.read_text(), tuning_pb2.TrialRequested())
    store = ArtifactStore(args.out)
    rank = int(os.environ["RANK"])
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        checkpoints = Path(store.path(_CHECKPOINTS)) if store.local else work / _CHECKPOINTS
        upload = None
        if not store.local:
            # Every rank restores from the same checkpoint; only rank 0 writes one.
            store.get_checkpoint(_CHECKPOINTS, checkpoints)
            upload = functools.partial(store.put_checkpoint, checkpoints, _CHECKPOINTS)
        try:
            spec = trials.run_spec(
                request,
                checkpoint_dir=checkpoints,
                export_dir=work / "model",
                tensorboard_dir=work / "tensorboard",
                device=args.device,
                threads=0,
                world_size=int(os.environ["WORLD_SIZE"]),
                code_cache=Path(tempfile.gettempdir()) / "aistack-code",
            )
            put_on_path(spec.code)
            wanted = trials.data_request(
                request, features_path=args.features_path, mnist_path=args.mnist_path
            )
            data = datasets.load(
                wanted.dataset, wanted.options, seed=wanted.seed, features_path=wanted.features_path
            )
            channel = _PrintChannel(upload)
            if spec.entrypoint:
                outcome, request_export = user_loop.under_launcher(spec, data, channel)
                if rank != 0:
                    return 0
                assert outcome is not None  # rank 0's
                result = user_loop.finish(spec, outcome, request_export)
            else:
                result, model = torch_ddp.train_under_launcher(spec, data, channel)
                if rank != 0:
                    return 0
                torch_runner.export(model, data, work / "model")
        except TrialError as error:
            failed = {"event": "failed", "reason": error.reason, "message": str(error)}
            print(json.dumps({**failed, "traceback": error.traceback}))
            return 2
        uri, sha, size = "", "", 0
        if (work / "model").is_dir():
            sha, size = digest(work / "model")
            uri = store.put_dir(work / "model", "model")
    print(
        json.dumps(
            {
                "event": "completed",
                "epochs": result.epochs_completed,
                "metrics": trials.progress_metrics({**result.val_metrics, **result.test_metrics}),
                "model_uri": uri,
                "sha256": sha,
                "size_bytes": size,
                "replica_digests": list(result.replica_digests),
            }
        )
    )
    return 0


if __name__ == "__main__":
    code = main()
    # Skip the interpreter's teardown, where gloo's threads now and then abort
    # a finished rank ("terminate called without an active exception").
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
