"""Code shipped with a study: packed the same way every time
(``shared.code_packages``), verified, unpacked and cached by digest on a
trainer, its requirements checked (``svc_trainer.user_code.packages``)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from aistack.studies import ship_code
from shared import code_packages
from shared.errors import InvalidArgument
from svc_trainer.plan import CodeRef, TrialError
from svc_trainer.user_code import packages


def project(root: Path) -> Path:
    (root / "mypkg").mkdir(parents=True)
    (root / "mypkg" / "__init__.py").write_text("")
    (root / "mypkg" / "model.py").write_text("def build(params, data):\n    return None\n")
    (root / "mypkg" / "__pycache__").mkdir()
    (root / "mypkg" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"stale")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: main")
    return root


def test_the_same_files_pack_to_the_same_bytes_without_caches(tmp_path: Path) -> None:
    first = code_packages.pack(project(tmp_path / "a"))
    second = code_packages.pack(project(tmp_path / "b"))
    assert first.data == second.data and first.sha256 == second.sha256
    with tarfile.open(fileobj=io.BytesIO(first.data), mode="r:gz") as tar:
        assert sorted(tar.getnames()) == ["mypkg/__init__.py", "mypkg/model.py"]
    (tmp_path / "b" / "mypkg" / "model.py").write_text("def build(params, data):\n    return 1\n")
    assert code_packages.pack(tmp_path / "b").sha256 != first.sha256


def test_nothing_to_ship_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="not a directory"):
        code_packages.pack(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidArgument, match="no files"):
        code_packages.pack(tmp_path / "empty")


def shipped(tmp_path: Path) -> CodeRef:
    package = ship_code(project(tmp_path / "src"), str(tmp_path / "store"))
    assert package.uri.endswith(f"code/{package.sha256}.tar.gz")
    return CodeRef(package.uri, package.sha256, str(tmp_path / "cache" / package.sha256))


def test_a_trainer_unpacks_a_package_once_and_keeps_it_by_digest(tmp_path: Path) -> None:
    code = shipped(tmp_path)
    directory = packages.ensure(code)
    assert (directory / "mypkg" / "model.py").is_file()
    # Cached: the store may lose the archive, the trainer still has the code.
    Path(code.uri.removeprefix("file://")).unlink()
    assert packages.ensure(code) == directory


def test_a_tampered_package_is_refused_and_nothing_is_unpacked(tmp_path: Path) -> None:
    code = shipped(tmp_path)
    archive = Path(code.uri.removeprefix("file://"))
    project(tmp_path / "evil")
    (tmp_path / "evil" / "mypkg" / "model.py").write_text("import os\nos.system('true')\n")
    evil = code_packages.pack(tmp_path / "evil")
    archive.write_bytes(evil.data)  # the study still names the original digest
    assert evil.sha256 != code.sha256
    with pytest.raises(TrialError) as raised:
        packages.ensure(code)
    assert raised.value.reason == "code_rejected" and raised.value.fatal_to_study
    assert not Path(code.directory).exists()


def test_a_package_whose_archive_is_gone_is_refused(tmp_path: Path) -> None:
    code = CodeRef(f"file://{tmp_path}/nothing.tar.gz", "0" * 64, str(tmp_path / "cache"))
    with pytest.raises(TrialError) as raised:
        packages.ensure(code)
    assert raised.value.reason == "code_rejected"


def test_an_archive_cannot_write_outside_its_directory(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo("../escaped.py")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(tarfile.TarError):
        code_packages.unpack(buffer.getvalue(), tmp_path / "into")
    assert not (tmp_path / "escaped.py").exists()


def test_requirements_the_environment_meets_pass(tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").write_text(
        "# the project's\nnumpy>=1.0\ntorch\n-e .\npytest ; python_version < '3'\n"
    )
    packages.check_requirements(tmp_path)


def test_a_missing_requirement_fails_the_study_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").write_text("numpy>=999\nno-such-package-aistack==1.0\n")
    with pytest.raises(TrialError) as raised:
        packages.check_requirements(tmp_path)
    error = raised.value
    assert error.reason == "missing_dependency" and error.fatal_to_study
    assert "numpy>=999 (installed: " in str(error)
    assert "no-such-package-aistack==1.0 (not installed)" in str(error)
    assert "\n" not in str(error)


def test_pyproject_dependencies_count_as_requirements(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\ndependencies = ["no-such-package-aistack"]\n'
    )
    assert packages.requirements(tmp_path) == ["no-such-package-aistack"]
    with pytest.raises(TrialError, match="not installed"):
        packages.check_requirements(tmp_path)
