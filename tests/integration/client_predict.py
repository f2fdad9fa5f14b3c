"""``aistack.Client.predict`` (tritonclient) in a process of its own, for
tests whose process holds aistack's own ``inference`` protos.

``python -m tests.integration.client_predict TARGET MODEL VERSION X.npy``
prints one JSON object: the version that answered and each output. It waits
up to 90 s for the model to be served.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from aistack.client import Client
from aistack.settings import ClientSettings, ModelClientSettings


def main(argv: list[str]) -> int:
    target, model, version, path = argv
    client = Client(settings=ClientSettings(model=ModelClientSettings(target=target)))
    deadline = time.monotonic() + 90
    while True:
        try:
            prediction = client.predict(model, np.load(path), version=version)
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    outputs = {name: values.tolist() for name, values in prediction.outputs.items()}
    print(json.dumps({"version": prediction.version, "outputs": outputs}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
