"""``aistack predict MODEL --input …``: one prediction from svc_model through
a stock client (``aistack.predictions``: tritonclient's gRPC client), for
people.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from shared.errors import InvalidArgument

if TYPE_CHECKING:
    import numpy as np


def predict(
    ctx: typer.Context,
    model: str,
    input: Annotated[
        str | None,
        typer.Option(
            "--input", help="a .npy file, a JSON file, or a JSON array (e.g. '[[0.1, 0.2]]')"
        ),
    ] = None,
    entity: Annotated[
        str | None, typer.Option(help="predict from this entity's latest features instead")
    ] = None,
    feature: Annotated[
        str | None, typer.Option(help="the online-store field with --entity")
    ] = None,
    open_window: Annotated[
        bool,
        typer.Option(
            "--open",
            help="with --entity: the open window's running aggregate, not the last closed window",
        ),
    ] = False,
    version: Annotated[str, typer.Option(help="a model version (default: the champion)")] = "",
    url: Annotated[str, typer.Option(help="svc_model's gRPC address")] = "localhost:8001",
    token: Annotated[
        str | None, typer.Option(help="bearer token, when the server asks for one")
    ] = None,
    tls_ca: Annotated[str | None, typer.Option(help="CA file: connect with TLS")] = None,
    tls_cert: Annotated[
        str | None, typer.Option(help="with --tls-ca: a client certificate (mutual TLS)")
    ] = None,
    tls_key: Annotated[str | None, typer.Option(help="the client certificate's key")] = None,
) -> int:
    """One prediction from the model server (a stock tritonclient)."""
    if (input is None) == (entity is None):
        raise typer.BadParameter(
            "give exactly one of --input and --entity", ctx, param_hint="--input"
        )
    # The client extra's packages: imported here so that the rest of the
    # aistack command works without them.
    import numpy as np

    from aistack.predictions import Server
    from aistack.predictions import predict as ask

    server = Server(
        url,
        token,
        Path(tls_ca) if tls_ca else None,
        Path(tls_cert) if tls_cert else None,
        Path(tls_key) if tls_key else None,
    )
    prediction = ask(
        server,
        model,
        read_input(input) if input is not None else None,
        version=version,
        entity=entity,
        feature=feature or "",
        open_window=open_window,
    )
    print(f"model {prediction.model} version {prediction.version}")
    for name, values in prediction.outputs.items():
        print(f"{name} {list(values.shape)}: {np.array2string(values, precision=4)}")
        if name == "probabilities":
            print(f"predicted class: {values.argmax(axis=-1).tolist()}")
    return 0


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
