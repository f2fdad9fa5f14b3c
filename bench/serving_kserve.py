"""The peer in bench.serving: KServe's Python ``ModelServer`` serving a
``torch.export`` artifact over its Open Inference Protocol (v2) gRPC endpoint.

Run as its own process (``python -m bench.serving_kserve --model_path
DIR/model.pt2 --name digits --grpc_port P --http_port Q``): kserve registers
the protobuf package ``inference``, as tritonclient and aistack's contracts do,
and two of them in one process clash. With ``--model_path -`` it reads the
path from its first line of stdin once its imports are done, so that they
overlap with the export.

The model is written the way KServe's docs write a custom model: ``load``
builds the module once, a synchronous ``predict`` takes the v2 request and
returns a v2 response. One worker process; torch's default threads unless
``--threads`` says otherwise (bench.serving gives svc_model the same number);
per-request logging off (as svc_model runs at WARNING).
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

import kserve  # type: ignore[import-untyped]
import numpy as np
import torch
from kserve import InferOutput, InferRequest, InferResponse


class DigitsModel(kserve.Model):  # type: ignore[misc]
    def __init__(self, name: str, path: str) -> None:
        super().__init__(name)
        self.path = path
        self.module: Any = None
        self.load()

    def load(self) -> bool:
        self.module = torch.export.load(self.path).module()
        self.ready = True
        return True

    def predict(
        self, payload: InferRequest, headers: dict[str, str] | None = None
    ) -> InferResponse:
        x = payload.inputs[0].as_numpy()
        if not (x.flags.writeable and x.flags.c_contiguous):
            # A view of the request's bytes: torch wants memory it may write.
            x = np.array(x, order="C", copy=True)
        with torch.inference_mode():
            y = self.module(torch.from_numpy(x)).numpy()
        output = InferOutput(name="probabilities", shape=list(y.shape), datatype="FP32")
        output.set_data_from_numpy(y)
        return InferResponse(
            response_id=payload.id or "",
            model_name=self.name,
            infer_outputs=[output],
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model_path", required=True, help="'-': read it from stdin")
    parser.add_argument("--name", default="digits")
    parser.add_argument("--grpc_port", type=int, required=True)
    parser.add_argument("--http_port", type=int, required=True)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: its default)")
    # kserve.model_server parses the same argv for its own flags: ignore theirs.
    args, _ = parser.parse_known_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    path = sys.stdin.readline().strip() if args.model_path == "-" else args.model_path
    if not path:
        print("serving_kserve: no model path", file=sys.stderr)
        return 2
    model = DigitsModel(args.name, path)
    server = kserve.ModelServer(
        grpc_port=args.grpc_port,
        http_port=args.http_port,
        workers=1,
        enable_latency_logging=False,
    )
    for name in ("kserve", "kserve.trace", "uvicorn", "uvicorn.access", "uvicorn.error"):
        logging.getLogger(name).setLevel(logging.WARNING)
    server.start([model])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
