"""``aistack predict MODEL --input …``: one prediction from svc_model through
a stock client (tritonclient's gRPC client), for people.

tritonclient registers the protobuf package ``inference``, so this module
never imports ``shared.contracts.inference`` (nor anything that does).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shared.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable

if TYPE_CHECKING:
    import numpy as np


def add_parser(commands: Any) -> None:
    predict = commands.add_parser(
        "predict", help="one prediction from the model server (a stock tritonclient)"
    )
    predict.add_argument("model")
    source = predict.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--input", help="a .npy file, a JSON file, or a JSON array (e.g. '[[0.1, 0.2]]')"
    )
    source.add_argument("--entity", help="predict from this entity's latest features instead")
    predict.add_argument("--feature", help="the online-store field with --entity")
    predict.add_argument(
        "--open",
        action="store_true",
        help="with --entity: the open window's running aggregate, not the last closed window",
    )
    predict.add_argument("--version", default="", help="a model version (default: the champion)")
    predict.add_argument("--url", default="localhost:8001", help="svc_model's gRPC address")
    predict.add_argument("--token", help="bearer token, when the server asks for one")
    predict.add_argument("--tls-ca", help="CA file: connect with TLS")
    predict.set_defaults(run=run)


#: The typed contents field of each protocol datatype.
_CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def output_array(result: Any, name: str) -> np.ndarray[Any, Any]:
    """Output ``name`` of a tritonclient result, raw or typed: tritonclient's
    ``as_numpy`` reads raw contents only, and the server answers a request
    without raw inputs (one by entity) with typed contents, as the protocol
    allows."""
    import numpy as np

    response = result.get_response()
    if response.raw_output_contents:
        return np.asarray(result.as_numpy(name))
    for output in response.outputs:
        if output.name == name:
            values = getattr(output.contents, _CONTENTS[output.datatype])
            return np.asarray(list(values)).reshape(list(output.shape))
    raise FailedPrecondition(f"the response has no output {name!r}")


def read_input(text: str) -> np.ndarray[Any, Any]:
    """An array from a .npy file, a JSON file or a JSON literal."""
    import numpy as np

    path = Path(text)
    if text.endswith(".npy"):
        if not path.is_file():
            raise InvalidArgument(f"--input: no such file {text}")
        return np.asarray(np.load(path, allow_pickle=False))
    if path.is_file():
        text = path.read_text()
    try:
        return np.asarray(json.loads(text))
    except ValueError as exc:
        raise InvalidArgument(f"--input: not a .npy file nor JSON: {exc}") from exc


def run(args: argparse.Namespace) -> int:
    # The client extra's packages: imported here so that the rest of the
    # aistack command works without them.
    import numpy as np
    import tritonclient.grpc as triton
    from tritonclient.utils import InferenceServerException, triton_to_np_dtype

    headers = {"authorization": f"Bearer {args.token}"} if args.token else None
    client = triton.InferenceServerClient(
        args.url, ssl=bool(args.tls_ca), root_certificates=args.tls_ca
    )
    try:
        metadata = client.get_model_metadata(
            args.model, args.version, headers=headers, as_json=True
        )
        inputs, parameters = [], {}
        if args.entity is not None:
            parameters["entity_id"] = args.entity
            if args.feature:
                parameters["feature"] = args.feature
            if args.open:
                parameters["window"] = "open"
        else:
            if len(metadata["inputs"]) != 1:
                raise FailedPrecondition(
                    f"model {args.model} takes {len(metadata['inputs'])} inputs; --input gives one"
                )
            spec = metadata["inputs"][0]
            array = read_input(args.input).astype(triton_to_np_dtype(spec["datatype"]))
            if len(spec["shape"]) == array.ndim + 1:
                array = array[np.newaxis]  # one example: add the batch dimension
            tensor = triton.InferInput(spec["name"], list(array.shape), spec["datatype"])
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        result = client.infer(
            args.model,
            inputs,
            model_version=args.version,
            headers=headers,
            parameters=parameters or None,
        )
    except InferenceServerException as exc:
        status = str(exc.status() or "")
        message = exc.message() or str(exc)
        if "NOT_FOUND" in status:
            raise NotFound(message) from exc
        if "UNAVAILABLE" in status:
            raise Unavailable(f"{args.url}: {message}") from exc
        raise InvalidArgument(f"{status}: {message}") from exc
    finally:
        client.close()
    response = result.get_response()
    print(f"model {response.model_name} version {response.model_version}")
    for output in metadata["outputs"]:
        values = output_array(result, output["name"])
        print(f"{output['name']} {list(values.shape)}: {np.array2string(values, precision=4)}")
        if output["name"] == "probabilities":
            print(f"predicted class: {values.argmax(axis=-1).tolist()}")
    return 0
