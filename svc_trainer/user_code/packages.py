"""A shipped code package on a trainer: fetched once, verified, unpacked,
cached by digest.

``ensure(code, cache_root)`` returns the directory to put first on the
path. The archive's bytes are checked against the digest the trial request
names before anything is unpacked: a package whose bytes differ (tampered
with, or corrupt) is refused and nothing of it runs. An unpacked package is
kept under its digest (``<cache>/<sha256>/``), so every later trial of the
same code finds it there.

A package says what it needs in ``requirements.txt`` or its
``pyproject.toml``'s ``[project] dependencies``; each must be installed in
the trainer's environment in a version it allows, or the trial (and the
study) fails with one line naming what is missing. Nothing is installed on
the fly: the trainer's environment is its image.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import tomllib
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

from shared import code_packages
from shared.contracts.aistack.v1 import common_pb2
from svc_trainer.plan import CodeRef, TrialError
from svc_trainer.user_code.failures import MISSING_DEPENDENCY

CODE_REJECTED = "code_rejected"
#: The file a finished unpack leaves: a directory without it is half-written.
_COMPLETE = ".aistack-complete"


def code_ref(package: common_pb2.CodePackage, cache_root: Path) -> CodeRef:
    """What a trial's processes need to find the package: where it is
    unpacked on this host, and where to fetch it elsewhere."""
    return CodeRef(package.uri, package.sha256.lower(), str(cache_root / package.sha256.lower()))


def ensure(code: CodeRef) -> Path:
    """The unpacked package ``code`` names, fetched and verified first if
    this host does not hold it yet. Raises TrialError: ``code_rejected``
    (missing, unreadable, or not the digest's bytes) or
    ``missing_dependency``, both fatal to the study."""
    target = Path(code.directory)
    if not (target / _COMPLETE).is_file():
        data = _read(code.uri)
        digest = code_packages.sha256_of(data)
        if digest != code.sha256:
            raise TrialError(
                f"the code package at {code.uri} has sha256 {digest}, the study names "
                f"{code.sha256}: refused, nothing of it runs",
                reason=CODE_REJECTED,
                fatal_to_study=True,
            )
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{code.sha256[:12]}-", dir=target.parent))
        try:
            code_packages.unpack(data, staging)
            (staging / _COMPLETE).write_text(code.sha256)
            if target.exists() and not (target / _COMPLETE).is_file():
                shutil.rmtree(target, ignore_errors=True)  # not ours: a copy by hand?
            try:
                os.replace(staging, target)
            except OSError:
                if not (target / _COMPLETE).is_file():  # not another process's unpack
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    check_requirements(target)
    return target


def put_on_path(code: CodeRef | None) -> None:
    """Put a shipped package first on this process's path (a process the
    trainer's executor did not start: a torchrun rank, a Spark task),
    fetching it first where this host does not hold it."""
    if code is None:
        return
    directory = str(ensure(code))
    if directory not in sys.path:
        sys.path.insert(0, directory)


def _read(uri: str) -> bytes:
    try:
        if "://" not in uri or uri.startswith("file://"):
            from shared.artifacts import local_path

            return local_path(uri).read_bytes()
        from shared import object_store
        from shared.settings import ObjectStoreSettings

        # A trial's process: the trainer's settings reach it as its environment.
        settings = ObjectStoreSettings()
        filesystem, path = object_store.filesystem(uri, settings)
        data: bytes = object_store.ride_out(
            lambda: filesystem.cat_file(path),
            seconds=settings.ride_out_s,
            what=f"code package {uri}",
        )
        return data
    except (OSError, ValueError) as exc:
        raise TrialError(
            f"the code package at {uri} cannot be read: {exc}",
            reason=CODE_REJECTED,
            fatal_to_study=True,
        ) from exc


def requirements(directory: Path) -> list[str]:
    """The requirement lines a package declares (``requirements.txt``, else
    ``pyproject.toml``'s ``[project] dependencies``)."""
    listed = directory / "requirements.txt"
    if listed.is_file():
        lines = (line.split("#", 1)[0].strip() for line in listed.read_text().splitlines())
        return [line for line in lines if line and not line.startswith("-")]
    project = directory / "pyproject.toml"
    if project.is_file():
        try:
            document = tomllib.loads(project.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise TrialError(
                f"the code package's pyproject.toml is not TOML: {exc}",
                reason=CODE_REJECTED,
                fatal_to_study=True,
            ) from exc
        return [str(r) for r in document.get("project", {}).get("dependencies", [])]
    return []


def check_requirements(directory: Path) -> None:
    """TrialError (``missing_dependency``, fatal to the study) naming every
    requirement of the package the trainer's environment does not meet."""
    unmet = list(unmet_requirements(requirements(directory)))
    if unmet:
        raise TrialError(
            "the code needs " + "; ".join(unmet) + ": install it in the trainer's image or "
            "environment (trainers install nothing on the fly)",
            reason=MISSING_DEPENDENCY,
            fatal_to_study=True,
        )


def unmet_requirements(lines: Iterable[str]) -> Iterable[str]:
    """Each requirement not met here, with what is installed instead."""
    from packaging.requirements import InvalidRequirement, Requirement

    for line in lines:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            yield f"{line!r} (not a requirement line)"
            continue
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        try:
            installed = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            yield f"{requirement} (not installed)"
            continue
        if requirement.specifier and not requirement.specifier.contains(
            installed, prereleases=True
        ):
            yield f"{requirement} (installed: {installed})"
