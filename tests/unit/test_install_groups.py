"""The install paths: `make setup` (CPU) and `make setup GPU=1` (CUDA)."""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _uv() -> str:
    found = shutil.which("uv") or str(Path.home() / ".local" / "bin" / "uv")
    if not Path(found).is_file():
        pytest.skip("uv is not installed (make setup installs it)")
    return found


def _extras_of_make(*args: str) -> list[str]:
    dry = subprocess.run(
        ["make", "-n", "venv", *args], cwd=ROOT, capture_output=True, text=True, check=True
    )
    [sync] = [line for line in dry.stdout.splitlines() if " sync " in line]
    words = sync.split()
    return [words[i + 1] for i, word in enumerate(words) if word == "--extra"]


def _export(*extras: str) -> set[str]:
    flags = [flag for extra in extras for flag in ("--extra", extra)]
    exported = subprocess.run(
        [_uv(), "export", "--frozen", "--no-hashes", "--no-emit-project", *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return {
        line.split(";")[0].strip()
        for line in exported.stdout.splitlines()
        if line and not line.startswith(("#", " "))
    }


def test_make_setup_picks_the_cpu_or_the_cuda_tensorflow() -> None:
    cpu = _extras_of_make()
    gpu = _extras_of_make("GPU=1")
    assert {"trainer", "model"} <= set(cpu) and not {"trainer-gpu", "model-gpu"} & set(cpu)
    assert {"trainer-gpu", "model-gpu"} <= set(gpu) and not {"trainer", "model"} & set(gpu)
    assert _extras_of_make("GPU=0") == cpu


def test_the_gpu_groups_resolve_to_tensorflow_with_cuda_and_never_beside_the_cpu_build() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    conflicts = project["tool"]["uv"]["conflicts"]
    pairs = {frozenset(entry["extra"] for entry in pair) for pair in conflicts}
    for cpu in ("trainer", "model"):
        for gpu in ("trainer-gpu", "model-gpu"):
            assert frozenset((cpu, gpu)) in pairs, f"{cpu} and {gpu} must be declared conflicting"

    pins = _export("trainer-gpu")
    assert "tensorflow==2.21.0" in pins
    assert any(pin.startswith("nvidia-cudnn-cu12==") for pin in pins), "no CUDA libraries"
    assert not any(pin.startswith("tensorflow-cpu") for pin in pins)
    assert any(pin.startswith("torch==") for pin in pins)

    cpu_pins = _export("trainer")
    assert "tensorflow-cpu==2.21.0" in cpu_pins
    assert not any(pin.startswith("tensorflow==") for pin in cpu_pins)
