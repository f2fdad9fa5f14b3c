"""A user's code on the real bus (Kafka, Redis, the tuner, two trainers and
the model server): their model, their data, their loop, shipped with the
study (``--code``) as the example project is, each run as a study to its
end; a prune reaching a loop within a step; a trial resumed from the loop's
checkpoint on the other trainer after a SIGKILL; every way a user's code can
go wrong ending as a failed trial a user can read, the trainers serving on;
a model trained elsewhere, registered, served and scored."""

from __future__ import annotations

import io
import shutil
import signal
import uuid
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shared import code_packages
from shared.artifacts import TORCH_EXPORT_FILE, digest, local_path
from shared.contracts.aistack.v1 import models_pb2, tuning_pb2
from shared.contracts.aistack.v1 import tuner_service_pb2 as api
from svc_monitor.watch import watched
from tests.infra import Infra
from tests.integration.user_stack import MEMORY_LIMIT_MB, STALL_SECONDS, UserStack
from tests.integration.user_stack import study_spec as spec
from tests.unit.test_trainer_data import TUMBLING, series, write_store

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "user_project"
LOOPS = Path(__file__).resolve().parent / "user_loops"


@pytest.fixture(scope="module")
def stack(infra: Infra, tmp_path_factory: pytest.TempPathFactory) -> Iterator[UserStack]:
    running = UserStack(infra, tmp_path_factory.mktemp("user-code"))
    try:
        yield running
    finally:
        running.close()


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The example's own data script: scikit-learn's tables as Parquet."""
    import sys

    sys.path.insert(0, str(EXAMPLE))
    try:
        from mymodels import data
    finally:
        sys.path.remove(str(EXAMPLE))
    written = data.write(tmp_path_factory.mktemp("tables"))
    return {path.stem: path for path in written}


def table_task(tables: dict[str, Path], name: str = "breast_cancer") -> dict[str, Any]:
    label = {"breast_cancer": "diagnosis", "wine": "cultivar"}[name]
    return {"dataset": "table", "options": {"path": str(tables[name]), "label": label}}


def trials(stack: UserStack, study: api.Study) -> list[api.Trial]:
    return sorted(stack.client.trials(study.study_id), key=lambda t: t.number)


def served_equals_own(stack: UserStack, name: str, version: str, x: np.ndarray) -> None:
    """The model server's answer through tritonclient is the exported model's own."""
    import torch

    event = stack.model_ready(name, version)
    program = torch.export.load(str(local_path(event.artifact_uri) / TORCH_EXPORT_FILE))
    with torch.no_grad():
        own = program.module()(torch.as_tensor(x)).numpy()
    got = stack.predict(name, x, version=version)
    assert got["version"] == version
    (output,) = event.outputs
    np.testing.assert_allclose(got["outputs"][output.name], own, rtol=1e-5, atol=1e-6)


def test_a_users_torch_model_on_a_table_is_tuned_exported_and_served(
    stack: UserStack, tables: dict[str, Path]
) -> None:
    name = f"cancer-torch-{uuid.uuid4().hex[:6]}"
    study = stack.run_study(
        spec(
            "torch-model",
            {
                **table_task(tables),
                "model": "mymodels.torch_model:build",
                "model_name": name,
                "epochs": 4,
            },
            params=[
                {
                    "name": "width",
                    "categorical": {"choices": [{"int_value": 8}, {"int_value": 16}]},
                },
                {"name": "learning_rate", "categorical": {"choices": [{"float_value": 0.01}]}},
            ],
            budget={"max_trials": 2, "max_parallel": 2, "trial_timeout": "120s"},
        ),
        code=EXAMPLE,
    )
    assert study.state == api.STUDY_STATE_COMPLETED, stack.logs()
    assert study.trial_counts == {"completed": 2}
    # The package's executor was a spare, warm before the study.
    assert any(t.log_events("executor.spare_taken") for t in stack.trainers)
    best = study.best_trial
    assert best.metrics["val_error"] < 0.2
    assert stack.client.best_trial(study.study_id).trial_id == best.trial_id
    event = stack.model_ready(name, best.model_version)
    package = code_packages.pack(EXAMPLE)
    assert event.lineage.code.model == "mymodels.torch_model:build"
    assert event.lineage.code.package.sha256 == package.sha256
    data = event.lineage.data
    assert data.dataset.startswith("table@") and data.label == "diagnosis"
    assert len(data.features) == 30 and data.split == "stratified 60/20/20, seed 0"
    assert list(data.files) == [str(tables["breast_cancer"])]
    assert [o.name for o in event.outputs] == ["probabilities"]
    served_equals_own(stack, name, best.model_version, np.zeros((3, 30), np.float32) + 1.0)
    # The Python client fetches the verified artifact and walks the same lineage.
    fetched = stack.client.fetch_model(name, best.model_version, into=stack.state / "fetched")
    assert digest(fetched)[0] == event.sha256
    tree = "\n".join(stack.client.lineage(f"{name}@{best.model_version}").lines())
    assert f"sha256 {package.sha256}" in tree
    # The lineage names the code and the data.
    shown = stack.cli("lineage", f"{name}@{best.model_version}")
    assert shown.returncode == 0, shown.stderr
    assert f"sha256 {package.sha256}" in shown.stdout
    assert "label diagnosis" in shown.stdout and str(tables["breast_cancer"]) in shown.stdout


def test_the_same_model_in_keras_trains_through_tensorflows_own_loop(
    stack: UserStack, tables: dict[str, Path], tmp_path: Path
) -> None:
    import tensorflow as tf
    import yaml

    name = f"cancer-keras-{uuid.uuid4().hex[:6]}"
    # Created from a YAML file, as a user's script would.
    spec_file = tmp_path / "keras-model.yaml"
    spec_file.write_text(
        yaml.safe_dump(
            spec(
                "keras-model",
                {
                    **table_task(tables),
                    "model": "mymodels.keras_model:build",
                    "framework": "FRAMEWORK_TENSORFLOW",
                    "model_name": name,
                },
            )
        )
    )
    study = stack.run_study(spec_file, code=EXAMPLE)
    assert study.state == api.STUDY_STATE_COMPLETED, stack.logs()
    event = stack.model_ready(name, study.best_trial.model_version)
    assert event.format == models_pb2.ARTIFACT_FORMAT_TF_SAVED_MODEL
    assert event.lineage.code.model == "mymodels.keras_model:build"
    x = np.ones((2, 30), np.float32)
    got = stack.predict(name, x, version=event.version)
    probabilities = np.asarray(got["outputs"]["probabilities"])
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)
    # The SavedModel's own answer, loaded by TensorFlow in this process.
    serving = tf.saved_model.load(str(local_path(event.artifact_uri))).signatures["serving_default"]
    own = serving(**{event.inputs[0].name: tf.constant(x)})["probabilities"].numpy()
    np.testing.assert_allclose(probabilities, own, rtol=1e-5, atol=1e-6)


def test_a_users_loader_feeds_a_users_model_and_names_itself_in_the_lineage(
    stack: UserStack,
) -> None:
    name = f"iris-{uuid.uuid4().hex[:6]}"
    study = stack.run_study(
        spec(
            "loader",
            {
                "dataset": "testloops.data:iris",
                "model": "testloops.models:sequential",
                "model_name": name,
                "epochs": 2,
            },
        ),
        code=LOOPS,
    )
    assert study.state == api.STUDY_STATE_COMPLETED, stack.logs()
    event = stack.model_ready(name, study.best_trial.model_version)
    data = event.lineage.data
    assert data.dataset.startswith("testloops.data:iris@")
    assert data.split == "stratified 60/20/20, seed 0"
    got = stack.predict(name, np.ones((2, 4), np.float32), version=event.version)
    assert np.asarray(got["outputs"]["probabilities"]).shape == (2, 3)


def test_a_users_own_loop_trains_under_ddp_with_two_ranks_and_is_served(
    stack: UserStack, tables: dict[str, Path]
) -> None:
    name = f"wine-loop-{uuid.uuid4().hex[:6]}"
    watched_lines = io.StringIO()
    study = stack.run_study(
        spec(
            "custom-loop",
            {
                **table_task(tables, "wine"),
                "entrypoint": "mymodels.train_loop:train",
                "strategy": "ddp",
                "world_size": 2,
                "model_name": name,
                "epochs": 6,
            },
            params=[{"name": "lr", "categorical": {"choices": [{"float_value": 0.02}]}}],
        ),
        code=EXAMPLE,
        progress=watched_lines,
    )
    assert study.state == api.STUDY_STATE_COMPLETED, stack.logs()
    # A line per change of the trials' states, not one per epoch's value.
    lines = [line for line in watched_lines.getvalue().splitlines() if line.startswith("[")]
    assert lines and all(a != b for a, b in pairwise(lines))
    assert len(lines) < 6 and "completed 1" in lines[-1]
    (trial,) = trials(stack, study)
    assert trial.metrics["val_error"] < 0.3
    reports = stack.reports(trial.trial_id)
    steps = [r.progress.step for r in reports if r.WhichOneof("event") == "progress"]
    assert steps == [1, 2, 3, 4, 5, 6]
    event = stack.model_ready(name, trial.model_version)
    assert event.lineage.code.entrypoint == "mymodels.train_loop:train"
    assert event.labels["strategy"] == "ddp"
    x = np.asarray(np.random.default_rng(0).normal(size=(4, 13)) * 10 + 50, np.float32)
    served_equals_own(stack, name, trial.model_version, x)


def test_a_prune_reaches_a_users_loop_within_one_step(stack: UserStack) -> None:
    study = stack.run_study(
        spec(
            "prune-loop",
            {"entrypoint": "testloops.slow:train", "epochs": 12},
            params=[{"name": "pause", "categorical": {"choices": [{"float_value": 1.0}]}}],
            sampler={"kind": "SAMPLER_KIND_RANDOM"},
            pruner={"kind": "PRUNER_KIND_MEDIAN", "startup_trials": 1},
            budget={"max_trials": 2, "max_parallel": 1, "trial_timeout": "120s"},
        ),
        code=LOOPS,
    )
    assert study.state == api.STUDY_STATE_COMPLETED, stack.logs()
    first, second = trials(stack, study)
    assert first.state == api.TRIAL_STATE_COMPLETED
    assert second.state == api.TRIAL_STATE_PRUNED
    control = stack.recorder.wait_for(
        stack.topics.control,
        lambda c: isinstance(c, tuning_pb2.TrialControl) and c.trial_id == second.trial_id,
        timeout=30,
    )
    assert isinstance(control, tuning_pb2.TrialControl)
    # The tuner ends the trial as it decides; the trainer's report follows.
    final = stack.recorder.wait_for(
        stack.topics.reports,
        lambda r: isinstance(r, tuning_pb2.TrialReport)
        and r.trial_id == second.trial_id
        and r.WhichOneof("event") == "pruned",
        timeout=30,
    )
    assert isinstance(final, tuning_pb2.TrialReport)
    # The loop stopped at the report after the one that got it pruned, at the latest.
    assert final.pruned.step <= control.step + 1
    steps = [
        r.progress.step
        for r in stack.reports(second.trial_id)
        if r.WhichOneof("event") == "progress"
    ]
    assert max(steps) <= control.step + 1 < 12


def test_every_way_a_users_code_fails_ends_as_a_failed_trial_and_the_trainers_serve_on(
    stack: UserStack,
) -> None:
    cases = ["raise", "nan", "silent_return", "exit", "abort", "allocate", "hang"]
    study = stack.run_study(
        spec(
            "bad-code",
            {"entrypoint": "testloops.cases:train", "epochs": 1},
            params=[
                {
                    "name": "case",
                    "categorical": {"choices": [{"string_value": c} for c in cases]},
                }
            ],
            budget={
                "max_trials": len(cases),
                "max_parallel": 2,
                "trial_timeout": "300s",
                "max_attempts": 1,
            },
        ),
        code=LOOPS,
        timeout=600,
    )
    assert study.state == api.STUDY_STATE_COMPLETED, stack.logs()
    by_case = {t.params["case"].string_value: t for t in trials(stack, study)}
    expected = {
        "raise": "user_code_error: the training loop raised ValueError: shapes do not match",
        "nan": "nan_metric: val_loss=nan at step 1",
        "silent_return": "no_report: the training loop returned without reporting",
        "exit": "user_code_exit: the training loop called sys.exit(3)",
        "abort": "executor_died: the trial's executor",
        "allocate": "memory_limit: the trial's processes held",
        "hang": f"loop_silent: the training loop neither reported nor asked should_stop() "
        f"for {STALL_SECONDS}",
    }
    for case, said in expected.items():
        trial = by_case[case]
        assert trial.state in (api.TRIAL_STATE_FAILED, api.TRIAL_STATE_QUARANTINED), case
        assert any(said in error for error in trial.errors), (case, list(trial.errors))
    # Retryable as docs/your-model.md's table says: only a crash may be the machine's.
    retryable = {
        case: {
            r.failed.retryable
            for r in stack.reports(by_case[case].trial_id)
            if r.WhichOneof("event") == "failed"
        }
        for case in cases
    }
    assert retryable == {case: {case == "abort"} for case in cases}
    assert "cases.py" in by_case["raise"].traceback and "ValueError" in by_case["raise"].traceback
    assert "killed by SIGABRT" in by_case["abort"].errors[-1]
    # The executor's dying words: the Python stack faulthandler wrote.
    assert "cases.py" in by_case["abort"].traceback
    assert f"limit of {MEMORY_LIMIT_MB} MiB" in by_case["allocate"].errors[-1]
    # aistack study show names each failure and the lines that explain it.
    shown = stack.cli("study", "show", study.study_id)
    assert shown.returncode == 0, shown.stderr
    assert "failed trials:" in shown.stdout
    assert "user_code_error: the training loop raised ValueError" in shown.stdout
    assert "raise ValueError(" in shown.stdout
    # Both trainers still take trials.
    after = stack.run_study(
        spec(
            "after-bad",
            {"entrypoint": "testloops.cases:train", "epochs": 1},
            params=[{"name": "case", "categorical": {"choices": [{"string_value": "ok"}]}}],
        ),
        code=LOOPS,
    )
    assert after.state == api.STUDY_STATE_COMPLETED, stack.logs()
    assert all(t.process.poll() is None for t in stack.trainers)


@pytest.mark.parametrize(
    ("entrypoint", "requirements", "reason", "said"),
    [
        ("nowhere.train:train", "", "user_code_import", "no module 'nowhere'"),
        ("testloops.broken:train", "", "missing_dependency", "'no_such_module_of_the_users'"),
        (
            "testloops.cases:train",
            "no-such-dist-of-the-users>=1.0\nnumpy\n",
            "missing_dependency",
            "the code needs no-such-dist-of-the-users>=1.0 (not installed)",
        ),
    ],
)
def test_code_that_cannot_be_imported_fails_the_study_with_one_line(
    stack: UserStack, tmp_path: Path, entrypoint: str, requirements: str, reason: str, said: str
) -> None:
    code = LOOPS
    if requirements:
        # The package says what it needs: checked before any of it is imported.
        code = tmp_path / "project"
        shutil.copytree(LOOPS, code)
        (code / "requirements.txt").write_text(requirements)
    study = stack.run_study(
        spec(
            "unimportable",
            {"entrypoint": entrypoint},
            params=[{"name": "case", "categorical": {"choices": [{"string_value": "ok"}]}}],
            budget={"max_trials": 4, "max_parallel": 2, "trial_timeout": "120s"},
            sampler={"kind": "SAMPLER_KIND_RANDOM"},
        ),
        code=code,
    )
    assert study.state == api.STUDY_STATE_FAILED
    assert f"{reason}: " in study.error and said in study.error, study.error
    assert "\n" not in study.error
    # Not quarantined trial after trial: the study stopped at the first.
    assert study.trial_counts.get("quarantined", 0) == 0
    assert sum(study.trial_counts.values()) <= 2


def test_each_code_package_gets_an_executor_that_its_trials_reuse(
    stack: UserStack, tmp_path: Path
) -> None:
    def package(name: str) -> Path:
        project = tmp_path / name
        shutil.copytree(LOOPS, project)
        # A package no trainer has seen (one it has unpacked before, it keeps).
        (project / "testloops" / "unique.py").write_text(f"# {uuid.uuid4()}\n")
        return project

    def executors(study: api.Study) -> dict[str, list[int]]:
        """The executor each of the study's trials ran in, by trainer."""
        ids = {t.trial_id for t in trials(stack, study)}
        return {
            trainer.name: [
                int(line["executor_pid"])
                for line in trainer.log_events("trial.started")
                if line["trial_id"] in ids
            ]
            for trainer in stack.trainers
        }

    def ok(name: str, count: int) -> dict[str, Any]:
        return spec(
            name,
            {"entrypoint": "testloops.cases:train", "epochs": 1},
            params=[{"name": "case", "categorical": {"choices": [{"string_value": "ok"}]}}],
            sampler={"kind": "SAMPLER_KIND_RANDOM"},
            budget={"max_trials": count, "max_parallel": 1, "trial_timeout": "120s"},
        )

    first = stack.run_study(ok("package-a", 4), code=package("a"))
    assert first.state == api.STUDY_STATE_COMPLETED, stack.logs()
    second = stack.run_study(ok("package-b", 2), code=package("b"))
    assert second.state == api.STUDY_STATE_COMPLETED, stack.logs()
    ran_a, ran_b = executors(first), executors(second)
    assert sum(len(pids) for pids in ran_a.values()) == 4, ran_a
    # Four trials on two trainers: each trainer ran its share in one executor.
    assert all(len(set(pids)) <= 1 for pids in ran_a.values()), ran_a
    # The other package's trials ran in executors of their own.
    for trainer in stack.trainers:
        assert not set(ran_a[trainer.name]) & set(ran_b[trainer.name]), (ran_a, ran_b)


def test_shipped_code_whose_bytes_are_not_its_digest_is_refused_and_never_runs(
    stack: UserStack, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    shutil.copytree(LOOPS, project)
    # A package no trainer has seen (one it has unpacked before, it keeps).
    (project / "testloops" / "unique.py").write_text(f"# {uuid.uuid4()}\n")
    package = stack.client.ship_code(project)
    # Someone rewrites the archive in the store after the study named its digest.
    (project / "testloops" / "cases.py").write_text("import os\nos.system('touch /tmp/pwned')\n")
    local_path(package.uri).write_bytes(code_packages.pack(project).data)
    document = spec("tampered", {"entrypoint": "testloops.cases:train"})
    document["task"]["code"] = {"uri": package.uri, "sha256": package.sha256}
    study = stack.run_study(document)
    assert study.state == api.STUDY_STATE_FAILED
    assert "code_rejected" in study.error and package.sha256 in study.error
    (trial,) = trials(stack, study)
    events = {r.WhichOneof("event") for r in stack.reports(trial.trial_id)}
    assert "started" not in events  # nothing of it ran


def test_a_model_trained_elsewhere_is_registered_served_and_scored(
    stack: UserStack, tmp_path: Path
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.Softmax(dim=-1)).eval()
    example = torch.zeros(2, 4)
    program = torch.export.export(
        model, (example,), dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=1024)},)
    )
    torch.export.save(program, str(tmp_path / "outside.pt2"))
    name = f"outside-{uuid.uuid4().hex[:6]}"
    registered = stack.cli(
        "models", "register", name, "--artifact", str(tmp_path / "outside.pt2"),
        "--metric", "val_error=0.1", "--objective", "val_error:minimize",
        "--label", "team=forecasting",
    )  # fmt: skip
    assert registered.returncode == 0, registered.stderr
    assert f"registered {name} version 1" in registered.stdout
    event = stack.model_ready(name, "1")
    assert [(s.name, s.datatype, list(s.shape)) for s in event.inputs] == [
        ("input", "FP32", [-1, 4])
    ]
    assert event.labels["team"] == "forecasting" and event.objective.metric == "val_error"
    x = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
    got = stack.predict(name, x)
    with torch.no_grad():
        own = model(torch.as_tensor(x)).numpy()
    np.testing.assert_allclose(got["outputs"]["output"], own, rtol=1e-5, atol=1e-6)
    # A second registration is the next version; this one read a feature's
    # windows, so svc_monitor watches it against their distribution.
    write_store(tmp_path / "store", series("sensor-1", 12))
    again = stack.cli(
        "models", "register", name, "--artifact", str(tmp_path / "outside.pt2"),
        "--feature", f"temperature@{TUMBLING}",
        env={"AISTACK_TRAINER_FEATURES_PATH": str(tmp_path / "store")},
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert f"{name} version 2" in again.stdout and "12 training windows" in again.stdout
    second = stack.model_ready(name, "2")
    watch = watched(second)
    assert watch is not None and watch.feature == f"temperature@{TUMBLING}"
    assert second.labels["feature"] == watch.feature
    # Scored in Spark as any trained model.
    pq.write_table(pa.table({f"c{i}": x[:, i] for i in range(4)}), tmp_path / "rows.parquet")
    scored = stack.cli(
        "score", f"{name}@1", "--input", str(tmp_path / "rows.parquet"),
        "--output", str(tmp_path / "scored"), "--columns", "c0,c1,c2,c3",
    )  # fmt: skip
    assert scored.returncode == 0, scored.stderr[-3000:]
    assert f"scored 3 rows with {name} version 1" in scored.stdout
    rows = pq.read_table(tmp_path / "scored").to_pylist()
    assert len(rows) == 3
    # A TorchScript file says no signature of its own: the client's call gives it.
    torch.jit.trace(model, example).save(str(tmp_path / "outside.pt"))
    third = stack.client.register_model(
        name,
        tmp_path / "outside.pt",
        inputs=[models_pb2.TensorSpec(name="input", datatype="FP32", shape=[-1, 4])],
        outputs=[models_pb2.TensorSpec(name="output", datatype="FP32", shape=[-1, 3])],
    )
    assert third.version == "3" and third.format == models_pb2.ARTIFACT_FORMAT_TORCHSCRIPT
    got = stack.predict(name, x, version="3")
    np.testing.assert_allclose(got["outputs"]["output"], own, rtol=1e-5, atol=1e-6)


def test_a_trainer_killed_mid_trial_hands_it_to_the_other_which_resumes_from_the_loops_checkpoint(
    stack: UserStack,
) -> None:
    study = stack.client.create_study(
        spec(
            "killed",
            {"entrypoint": "testloops.slow:train", "epochs": 10},
            params=[{"name": "pause", "categorical": {"choices": [{"float_value": 1.0}]}}],
        ),
        code=LOOPS,
    )
    trial_id = f"{study.study_id}/0"

    def progressed() -> tuning_pb2.TrialReport | None:
        for report in stack.reports(trial_id, ended=False):
            if report.WhichOneof("event") == "progress" and report.progress.step >= 3:
                return report
        return None

    stack.wait_for("the trial reaching step 3", lambda: progressed() is not None)
    running = progressed()
    assert running is not None
    victim = next(t for t in stack.trainers if t.name == running.trainer_id)
    victim.process.send_signal(signal.SIGKILL)
    victim.process.wait(timeout=30)
    ended = stack.client.wait(study.study_id, progress=False, timeout=300)
    assert ended.state == api.STUDY_STATE_COMPLETED, stack.logs()
    reports = stack.reports(trial_id)
    resumed = [
        r for r in reports if r.WhichOneof("event") == "started" and r.trainer_id != victim.name
    ]
    assert resumed and resumed[-1].started.resumed_from_step >= 3
    completed = stack.recorder.wait_for(
        stack.topics.reports,
        lambda r: isinstance(r, tuning_pb2.TrialReport)
        and r.trial_id == trial_id
        and r.WhichOneof("event") == "completed",
        timeout=30,
    )
    assert isinstance(completed, tuning_pb2.TrialReport)
    assert completed.trainer_id != victim.name
    reports = stack.reports(trial_id)
    # Every step reported once after the resume: none trained twice past the checkpoint.
    after = [
        r.progress.step
        for r in reports
        if r.WhichOneof("event") == "progress" and r.trainer_id != victim.name
    ]
    assert after == list(range(resumed[-1].started.resumed_from_step + 1, 11))
