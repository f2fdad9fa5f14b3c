"""A Java runtime's copy in the cache is complete for the pom it was fetched
from: a changed pom is fetched again into the same home."""

from __future__ import annotations

import hashlib
from pathlib import Path

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
