"""Regenerate shared/contracts from proto/: the one command for generated code.

``python -m shared.contracts.codegen`` writes the modules; ``--check`` only
compares and exits 1 when the committed-to-disk modules are stale.
"""

from __future__ import annotations

import argparse
import filecmp
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
PROTO_ROOT = PROJECT_ROOT / "proto"
CONTRACTS_DIR = Path(__file__).resolve().parent
GENERATED_PACKAGES = ("aistack", "inference")
DESCRIPTOR_SET = "aistack_v1.binpb"

_AISTACK_IMPORT = re.compile(r"^from aistack\.v1 import ", re.MULTILINE)
_INFERENCE_IMPORT = re.compile(r"^import grpc_predict_v2_pb2 as ", re.MULTILINE)


class CodegenError(RuntimeError):
    """protoc rejected a .proto file."""


def _protoc(args: Sequence[str]) -> None:
    # In its own process: grpc_tools embeds libprotoc, which crashes a process
    # that has loaded TensorFlow (its own protobuf) or Triton's LLVM.
    well_known = str(resources.files("grpc_tools") / "_proto")
    done = subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{well_known}", *args],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise CodegenError(
            f"protoc failed with exit code {done.returncode}: {' '.join(args)}\n{done.stderr}"
        )


def _rewrite_imports(root: Path) -> None:
    # protoc writes absolute imports ("from aistack.v1 import x_pb2"); the
    # generated packages live under shared.contracts, so make them resolvable
    # without putting shared/contracts on sys.path.
    for path in root.rglob("*.py*"):
        if path.suffix not in (".py", ".pyi"):  # not __pycache__'s .pyc
            continue
        text = path.read_text()
        new = _AISTACK_IMPORT.sub("from shared.contracts.aistack.v1 import ", text)
        new = _INFERENCE_IMPORT.sub(
            "from shared.contracts.inference import grpc_predict_v2_pb2 as ", new
        )
        if new != text:
            path.write_text(new)


def generate(out_dir: Path) -> None:
    """Write the generated packages (and the descriptor set) into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    aistack_protos = sorted(
        str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.glob("aistack/v1/*.proto")
    )
    outs = [f"--python_out={out_dir}", f"--pyi_out={out_dir}", f"--grpc_python_out={out_dir}"]
    _protoc([f"-I{PROTO_ROOT}", *outs, *aistack_protos])
    # Spark's from_protobuf/to_protobuf read messages from a descriptor set.
    _protoc(
        [
            f"-I{PROTO_ROOT}",
            f"--descriptor_set_out={out_dir / DESCRIPTOR_SET}",
            "--include_imports",
            *aistack_protos,
        ]
    )
    # Compiled from its own directory so its descriptor's file name is
    # "grpc_predict_v2.proto", exactly as KServe's (and Triton's index beside it).
    inference_out = out_dir / "inference"
    inference_out.mkdir(exist_ok=True)
    _protoc(
        [
            f"-I{PROTO_ROOT / 'inference'}",
            f"--python_out={inference_out}",
            f"--pyi_out={inference_out}",
            f"--grpc_python_out={inference_out}",
            "grpc_predict_v2.proto",
            "model_repository.proto",
        ]
    )
    for pkg in (out_dir / "aistack", out_dir / "aistack" / "v1", inference_out):
        (pkg / "__init__.py").write_text("")
    _rewrite_imports(out_dir)


def _generated_files(root: Path) -> list[Path]:
    files = [p.relative_to(root) for pkg in GENERATED_PACKAGES for p in (root / pkg).rglob("*")]
    files.append(Path(DESCRIPTOR_SET))
    return sorted(f for f in files if "__pycache__" not in f.parts and not (root / f).is_dir())


def stale_files(target: Path = CONTRACTS_DIR) -> list[str]:
    """Files under ``target`` that differ from a fresh generation (or are missing)."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp)
        generate(fresh)
        expected = _generated_files(fresh)
        stale = [
            str(f)
            for f in expected
            if not (target / f).is_file() or not filecmp.cmp(fresh / f, target / f, shallow=False)
        ]
        extra = (
            set(_generated_files(target)) - set(expected)
            if (target / "aistack").exists()
            else set()
        )
        return stale + sorted(str(f) for f in extra)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if the generated code is stale"
    )
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files()
        if stale:
            print(f"generated code is stale; run `make proto`: {', '.join(stale)}", file=sys.stderr)
            return 1
        return 0
    for pkg in GENERATED_PACKAGES:
        shutil.rmtree(CONTRACTS_DIR / pkg, ignore_errors=True)
    generate(CONTRACTS_DIR)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
