"""A TensorFlow cluster's job files: the spec and data a worker trains on,
written as JSON and .npz (no pickles)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shared.settings import SparkSettings
from svc_trainer.backends.tensorflow.cluster import read_job, write_job
from tests.integration.trainer_support import digits_splits, run_spec


def test_a_spec_round_trips_without_the_trainers_spark_settings(tmp_path: Path) -> None:
    # The worker passes its Spark settings to every spec; a TF worker starts no Spark.
    spec = run_spec(
        tmp_path, strategy="multi_worker_mirrored", spark=SparkSettings(master="local[2]")
    )
    data = digits_splits()
    write_job(tmp_path, spec, data)
    read_spec, read_data = read_job(tmp_path)
    assert read_spec.spark is None
    assert read_spec.trial_id == spec.trial_id and read_spec.hparams == spec.hparams
    assert read_spec.options == spec.options and read_spec.strategy == spec.strategy
    np.testing.assert_array_equal(read_data.x_train, data.x_train)


def test_the_users_code_and_parameters_and_the_datas_identity_round_trip(tmp_path: Path) -> None:
    from dataclasses import replace

    from svc_trainer.plan import CodeRef

    code = CodeRef("file:///store/code/x.tar.gz", "a" * 64, "/cache/aaaa")
    spec = run_spec(
        tmp_path,
        strategy="multi_worker_mirrored",
        entrypoint="pkg.loop:train",
        params={"width": 16, "act": "relu"},
        code=code,
    )
    data = replace(digits_splits(), feature_names=("a", "b"), label="digit", split="s")
    write_job(tmp_path, spec, data)
    read_spec, read_data = read_job(tmp_path)
    assert read_spec.code == code and read_spec.entrypoint == "pkg.loop:train"
    assert dict(read_spec.params) == {"width": 16, "act": "relu"}
    assert read_data.feature_names == ("a", "b") and read_data.label == "digit"
