"""Every study spec in examples/ is one the tuner takes, and the example
project's user-code studies name code that exists in the project."""

from __future__ import annotations

from pathlib import Path

import pytest

from aistack.studies import load_spec
from shared import code_refs
from svc_tuner import spec as specs

ROOT = Path(__file__).resolve().parents[2]
SPECS = sorted((ROOT / "examples").rglob("*.yaml"))


def test_the_examples_are_found() -> None:
    names = {path.name for path in SPECS}
    assert {"torch-model.yaml", "keras-model.yaml", "custom-loop.yaml", "forecast.yaml"} <= names


@pytest.mark.parametrize("path", SPECS, ids=lambda p: str(p.relative_to(ROOT)))
def test_an_example_spec_is_valid(path: Path) -> None:
    spec = load_spec(path.read_text())
    specs.validate(spec)
    task = spec.task
    for ref in (task.model, task.entrypoint):
        if ref:
            module, attribute = code_refs.parse(ref)
            source = path.parents[1] / (module.replace(".", "/") + ".py")
            assert source.is_file(), f"{ref}: no {source}"
            assert f"def {attribute}(" in source.read_text()
