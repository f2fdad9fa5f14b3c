"""``aistack predict``'s input: a .npy file, a JSON file or a JSON literal."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from aistack.cli.predict import read_input
from shared.errors import InvalidArgument


def test_a_json_literal_longer_than_a_file_name_is_read_as_json() -> None:
    batch = np.random.default_rng(0).random((1, 8, 8)).tolist()
    text = json.dumps(batch)
    assert len(text) > 255  # past what a file name may be: is_file() raises for it
    np.testing.assert_allclose(read_input(text), batch)


def test_npy_and_json_files_are_read_and_a_missing_npy_is_named(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.ones((2, 3)))
    assert read_input(str(tmp_path / "x.npy")).shape == (2, 3)
    (tmp_path / "x.json").write_text("[[1, 2]]")
    assert read_input(str(tmp_path / "x.json")).tolist() == [[1, 2]]
    with pytest.raises(InvalidArgument, match="no such file"):
        read_input(str(tmp_path / "missing.npy"))
    with pytest.raises(InvalidArgument, match=r"not a \.npy file nor JSON"):
        read_input("{not json")
