"""``aistack predict MODEL --input …``: one prediction from svc_model through
a stock client (``aistack.predictions``: tritonclient's gRPC client), for
people.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shared.errors import InvalidArgument

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
    predict.add_argument("--tls-cert", help="with --tls-ca: a client certificate (mutual TLS)")
    predict.add_argument("--tls-key", help="the client certificate's key")
    predict.set_defaults(run=run)


def read_input(text: str) -> np.ndarray[Any, Any]:
    """An array from a .npy file, a JSON file or a JSON literal."""
    import numpy as np

    path = Path(text)
    if text.endswith(".npy"):
        if not path.is_file():
            raise InvalidArgument(f"--input: no such file {text}")
        return np.asarray(np.load(path, allow_pickle=False))
    if _is_file(path):
        text = path.read_text()
    try:
        return np.asarray(json.loads(text))
    except ValueError as exc:
        raise InvalidArgument(f"--input: not a .npy file nor JSON: {exc}") from exc


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # a JSON literal longer than a file name may be
        return False


def run(args: argparse.Namespace) -> int:
    # The client extra's packages: imported here so that the rest of the
    # aistack command works without them.
    import numpy as np

    from aistack.predictions import Server, predict

    server = Server(
        args.url,
        args.token,
        Path(args.tls_ca) if args.tls_ca else None,
        Path(args.tls_cert) if args.tls_cert else None,
        Path(args.tls_key) if args.tls_key else None,
    )
    prediction = predict(
        server,
        args.model,
        read_input(args.input) if args.input is not None else None,
        version=args.version,
        entity=args.entity,
        feature=args.feature or "",
        open_window=args.open,
    )
    print(f"model {prediction.model} version {prediction.version}")
    for name, values in prediction.outputs.items():
        print(f"{name} {list(values.shape)}: {np.array2string(values, precision=4)}")
        if name == "probabilities":
            print(f"predicted class: {values.argmax(axis=-1).tolist()}")
    return 0
