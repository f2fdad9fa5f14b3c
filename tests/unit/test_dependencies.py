"""Dependencies point one way: ``compose`` (the launcher) may import the
services; a service imports ``shared``, the public package ``aistack`` (the
API user code sees, which svc_trainer implements) and itself, never another
service, ``compose``, ``loadgen``, ``bench`` or the tests; ``aistack``
imports ``shared`` and itself; ``shared`` imports only itself."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OURS = {"shared", "aistack", "compose", "loadgen", "bench", "tests"}
SERVICES = sorted(p.name for p in ROOT.glob("svc_*") if (p / "__init__.py").is_file())


def imported_packages(package: str) -> dict[str, set[str]]:
    """Each module of ``package`` (by path) → the top-level packages of ours it imports."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
        ours = {name for name in names if name in OURS or name.startswith("svc_")}
        found[str(path.relative_to(ROOT))] = ours
    return found


ALLOWED = {"shared": {"shared"}, "aistack": {"shared", "aistack"}}


@pytest.mark.parametrize("package", ["shared", "aistack", *SERVICES])
def test_a_package_imports_only_shared_and_itself(package: str) -> None:
    allowed = ALLOWED.get(package, {"shared", "aistack", package})
    wrong = {
        module: sorted(names - allowed)
        for module, names in imported_packages(package).items()
        if names - allowed
    }
    assert not wrong, f"{package} imports what it must not: {wrong}"


def test_the_services_are_found() -> None:
    expected = {"svc_ingest", "svc_transform", "svc_tuner", "svc_trainer", "svc_model", "svc_score"}
    assert expected <= set(SERVICES)
