"""Stock clients against svc_model, run in a process of their own (tritonclient
registers the protobuf package ``inference`` as our contracts do).

``python -m tests.integration.triton_client ADDRESS INPUT.npy MODEL...`` prints
one JSON object: per model, the outputs through tritonclient's
InferenceServerClient (raw contents) and through Triton's own generated stub
with typed contents; the server's health, metadata and repository index; and
an unload / load round trip of the first model.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import grpc
import numpy as np
import tritonclient.grpc as triton
from tritonclient.grpc import service_pb2, service_pb2_grpc


def raw_outputs(client: triton.InferenceServerClient, model: str, x: np.ndarray) -> Any:
    tensor = triton.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer(model, [tensor], outputs=[triton.InferRequestedOutput("probabilities")])
    response = result.get_response()
    return {
        "version": response.model_version,
        "probabilities": result.as_numpy("probabilities").tolist(),
    }


def typed_outputs(address: str, model: str, x: np.ndarray) -> Any:
    with grpc.insecure_channel(address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = service_pb2.ModelInferRequest(model_name=model, id="typed-1")
        tensor = request.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
        tensor.contents.fp32_contents.extend(x.ravel().tolist())
        response = stub.ModelInfer(request)
    out = response.outputs[0]
    values = np.asarray(out.contents.fp32_contents, dtype=np.float32).reshape(tuple(out.shape))
    return {"id": response.id, "name": out.name, "probabilities": values.tolist()}


def main(argv: list[str]) -> int:
    address, input_path, *models = argv
    x = np.load(input_path)
    client = triton.InferenceServerClient(address)
    report: dict[str, Any] = {
        "live": client.is_server_live(),
        "ready": client.is_server_ready(),
        "server": client.get_server_metadata(as_json=True),
        "models": {},
    }
    for model in models:
        report["models"][model] = {
            "ready": client.is_model_ready(model),
            "metadata": client.get_model_metadata(model, as_json=True),
            "raw": raw_outputs(client, model, x),
            "typed": typed_outputs(address, model, x),
        }
    report["index"] = client.get_model_repository_index(as_json=True)
    first = models[0]
    client.unload_model(first)
    report["ready_after_unload"] = client.is_model_ready(first)
    client.load_model(first)
    report["ready_after_load"] = client.is_model_ready(first)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
