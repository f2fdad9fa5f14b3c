"""A Java runtime's copy in the cache is complete for the pom and properties it
was fetched with: a changed pom is fetched again into the same home."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from shared import maven


def test_a_copy_is_complete_only_for_the_pom_it_was_fetched_from(tmp_path: Path) -> None:
    pom = tmp_path / "pom.xml"
    pom.write_text("<project><!-- one jar --></project>")
    home = tmp_path / "runtime"
    (home / "libs").mkdir(parents=True)
    assert not maven.is_fetched(home, pom)
    # What fetch_runtime leaves once Maven has copied the jars.
    (home / ".complete").write_text(f"a runtime\n{hashlib.sha256(pom.read_bytes()).hexdigest()}\n")
    assert maven.is_fetched(home, pom)
    assert maven.fetch_runtime(pom, home, expect="*.jar", what="a runtime") == home  # no Maven run
    pom.write_text("<project><!-- one jar, pinned --></project>")
    assert not maven.is_fetched(home, pom)


def test_properties_reach_maven_and_name_the_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stand-in for Maven that records its arguments as the file it copies.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    mvn = bin_dir / "mvn"
    mvn.write_text(
        "#!/bin/sh\n"
        'for a; do case "$a" in -DoutputDirectory=*) out="${a#-DoutputDirectory=}";; esac; done\n'
        'mkdir -p "$out" && echo "$@" > "$out/args.jar"\n'
    )
    mvn.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    pom = tmp_path / "pom.xml"
    pom.write_text("<project><!-- a program per platform --></project>")
    arm = {"protoc.classifier": "linux-aarch_64"}

    home = maven.fetch_runtime(pom, tmp_path / "rt", expect="*.jar", what="a tool", properties=arm)

    assert "-Dprotoc.classifier=linux-aarch_64" in (home / "libs" / "args.jar").read_text().split()
    assert maven.is_fetched(home, pom, arm)
    assert not maven.is_fetched(home, pom, {"protoc.classifier": "linux-x86_64"})
    assert not maven.is_fetched(home, pom)
