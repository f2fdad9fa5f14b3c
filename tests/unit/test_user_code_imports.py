"""A user's functions named "package.module:function": imported with one
line that says what went wrong (``svc_trainer.user_code.imports``), a
loader's data split as the study's (``loaders``), a model builder given the
trial's parameters as they were sent (``models``), what a user's code did
wrong as a failure (``failures``)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import aistack
from shared import code_refs
from shared.contracts.aistack.v1 import tuning_pb2
from svc_trainer.plan import TrialError
from svc_trainer.user_code import failures
from svc_trainer.user_code.imports import resolve
from svc_trainer.user_code.loaders import load_with

MODULES = {
    "good_pkg/__init__.py": "",
    "good_pkg/funcs.py": (
        "import numpy as np\n"
        "import aistack\n"
        "VALUE = 3\n"
        "def build(params, data):\n    return params\n"
        "class Holder:\n    @staticmethod\n    def make():\n        return 1\n"
        "def pair(options):\n"
        "    rng = np.random.default_rng(0)\n"
        "    x = rng.normal(size=(50, 3))\n"
        "    return x, np.where(x[:, 0] > 0, 'yes', 'no')\n"
        "def regression(options):\n"
        "    x = np.arange(40.0).reshape(20, 2)\n"
        "    return x, x[:, 0] * 2.0\n"
        "def nothing(options):\n    return 42\n"
        "def raises(options):\n    raise RuntimeError('the bucket is gone')\n"
    ),
    "good_pkg/nets.py": (
        "import torch\n"
        "SEEN = []\n"
        "def build(params, data):\n"
        "    SEEN.append(params)\n"
        "    return torch.nn.Linear(data.x_train.shape[1], data.n_classes)\n"
    ),
    "broken_pkg/__init__.py": "",
    "broken_pkg/syntax.py": "def build(:\n",
    "broken_pkg/needs.py": "import no_such_dependency_aistack\n",
    "broken_pkg/boom.py": "raise RuntimeError('at import')\n",
}


@pytest.fixture(autouse=True)
def on_path(tmp_path: Path) -> Iterator[None]:
    for name, text in MODULES.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    sys.path.insert(0, str(tmp_path))
    try:
        yield
    finally:
        sys.path.remove(str(tmp_path))
        for module in [m for m in sys.modules if m.split(".")[0] in ("good_pkg", "broken_pkg")]:
            del sys.modules[module]


def test_a_function_and_a_nested_attribute_resolve() -> None:
    assert resolve("good_pkg.funcs:build", "task.model")({"a": 1}, None) == {"a": 1}
    assert resolve("good_pkg.funcs:Holder.make", "task.model")() == 1


@pytest.mark.parametrize(
    ("ref", "reason", "said"),
    [
        ("missing_pkg.models:build", "user_code_import", "no module 'missing_pkg'"),
        ("good_pkg.nope:build", "user_code_import", "no module 'good_pkg.nope'"),
        ("good_pkg.funcs:buld", "user_code_import", "has no 'buld'"),
        ("good_pkg.funcs:VALUE", "user_code_import", "is a int, not a function"),
        ("broken_pkg.syntax:build", "user_code_import", "SyntaxError"),
        ("broken_pkg.boom:build", "user_code_import", "RuntimeError: at import"),
        ("broken_pkg.needs:build", "missing_dependency", "'no_such_dependency_aistack'"),
        ("not a ref", "user_code_import", "expected package.module:function"),
    ],
)
def test_what_cannot_be_imported_fails_the_study_with_one_line(
    ref: str, reason: str, said: str
) -> None:
    with pytest.raises(TrialError) as raised:
        resolve(ref, "task.entrypoint")
    error = raised.value
    assert error.reason == reason and error.fatal_to_study and not error.retryable
    assert said in str(error) and "\n" not in str(error)
    assert "task.entrypoint" in str(error)


def test_a_loaders_pair_is_split_as_a_study_split_with_its_classes() -> None:
    data = load_with("good_pkg.funcs:pair", {}, seed=0)
    assert data.task == aistack.CLASSIFICATION and data.class_names == ("no", "yes")
    assert data.n_classes == 2 and data.x_train.dtype == np.float32
    assert len(data.y_train) + len(data.y_val) + len(data.y_test) == 50
    assert data.split == "stratified 60/20/20, seed 0"
    assert load_with("good_pkg.funcs:pair", {}, seed=0).version == data.version
    assert load_with("good_pkg.funcs:pair", {}, seed=1).version != data.version
    regression = load_with("good_pkg.funcs:regression", {}, seed=0)
    assert regression.task == aistack.REGRESSION and regression.y_train.dtype == np.float32


def test_a_loader_returning_a_dataset_keeps_its_splits() -> None:
    module: Any = sys.modules.get("good_pkg.funcs") or __import__("good_pkg.funcs").funcs

    def given(options: dict[str, str]) -> aistack.Dataset:
        x = np.ones((4, 2), np.float32)
        y = np.array([0, 1, 0, 1])
        return aistack.Dataset("mine", "v7", aistack.CLASSIFICATION, x, y, x, y, x, y)

    module.given = given
    data = load_with("good_pkg.funcs:given", {}, seed=0)
    assert data.version == "v7" and data.n_classes == 2 and data.split.startswith("as ")


@pytest.mark.parametrize(
    ("ref", "said"),
    [
        ("good_pkg.funcs:nothing", "returned a int"),
        ("good_pkg.funcs:raises", "RuntimeError: the bucket is gone"),
    ],
)
def test_a_loader_that_fails_fails_the_study(ref: str, said: str) -> None:
    with pytest.raises(TrialError) as raised:
        load_with(ref, {}, seed=0)
    assert raised.value.fatal_to_study and said in str(raised.value)


@pytest.mark.parametrize(
    ("exc", "reason", "retryable"),
    [
        (ValueError("bad shape"), "user_code_error", False),
        (FileNotFoundError("/data/x"), "user_code_error", True),
        (SystemExit(3), "user_code_exit", False),
        (MemoryError(), "out_of_memory", False),
        (aistack.InvalidReport("no objective", reason="unknown_metric"), "unknown_metric", False),
        (aistack.ExportFailed("cannot trace"), "export_failed", False),
    ],
)
def test_what_a_users_code_raises_becomes_a_failure_with_its_traceback(
    exc: BaseException, reason: str, retryable: bool
) -> None:
    try:
        raise exc
    except BaseException as raised:
        error = failures.from_exception(raised, "training loop")
    assert (error.reason, error.retryable) == (reason, retryable)
    assert "test_user_code_imports.py" in error.traceback


@pytest.mark.parametrize(
    ("task", "field"),
    [
        ({"model": "a.b:c", "entrypoint": "a.b:d"}, "task.entrypoint"),
        ({"model_family": "cnn", "model": "a.b:c"}, "task.model_family"),
        ({"model": "a.b"}, "task.model"),
        ({"entrypoint": "a b:c"}, "task.entrypoint"),
        ({"dataset": "pkg.data:"}, "task.dataset"),
        ({"entrypoint": "a:b", "code": {"uri": "file:///x", "sha256": "12"}}, "task.code.sha256"),
        ({"entrypoint": "a:b", "code": {"sha256": "0" * 64}}, "task.code.uri"),
    ],
)
def test_a_task_naming_code_no_trainer_can_run_is_named(
    task: dict[str, object], field: str
) -> None:
    from google.protobuf import json_format

    message = json_format.ParseDict(task, tuning_pb2.TrainingTask())
    problem = code_refs.task_problem(message)
    assert problem is not None and problem[0] == field


def test_a_task_with_code_of_the_right_form_has_no_problem() -> None:
    task = tuning_pb2.TrainingTask(dataset="table", entrypoint="mypkg.train:train")
    task.code.uri = "file:///store/code/x.tar.gz"
    task.code.sha256 = "a" * 64
    assert code_refs.task_problem(task) is None


def test_a_users_model_builder_gets_every_parameter_as_sent_beside_the_built_ins(
    tmp_path: Path,
) -> None:
    import torch

    from shared.contracts.aistack.v1 import common_pb2
    from svc_trainer import trials
    from svc_trainer.backends.torch import strategy
    from svc_trainer.plan import TASK_CLASSIFICATION, DataSplits

    request = tuning_pb2.TrialRequested(
        trial_id="s/0",
        study_id="s",
        task=tuning_pb2.TrainingTask(
            dataset="table",
            framework=common_pb2.FRAMEWORK_TORCH,
            epochs=1,
            model="good_pkg.nets:build",
        ),
        objective=common_pb2.Objective(metric="val_error"),
    )
    sent = {
        "learning_rate": 0.01,  # built-in: the platform's loop reads these two too
        "batch_size": 16,
        "activation": "tanh",  # a built-in's name the user's model reads as well
        "width": 24,  # the user's own, of every kind a parameter takes
        "scale": 2.0,  # integral, yet a float
        "residual": True,  # a bool, not 1
        "norm": "layer",
    }
    kind = {bool: "bool_value", int: "int_value", float: "float_value", str: "string_value"}
    for name, value in sent.items():
        setattr(request.params[name], kind[type(value)], value)
    spec = trials.run_spec(
        request,
        checkpoint_dir=tmp_path / "c",
        export_dir=tmp_path / "e",
        tensorboard_dir=tmp_path / "t",
        device="cpu",
        threads=0,
        world_size=1,
    )
    x = np.zeros((4, 3), np.float32)
    y = np.array([0, 1, 0, 1])
    data = DataSplits("table", "v1", TASK_CLASSIFICATION, x, y, x, y, x, y, n_classes=2)

    model = strategy.check(spec, data)

    (given,) = sys.modules["good_pkg.nets"].SEEN
    assert given == sent
    assert {name: type(value) for name, value in given.items()} == {
        name: type(value) for name, value in sent.items()
    }
    assert (spec.hparams.learning_rate, spec.hparams.batch_size) == (0.01, 16)
    assert isinstance(model, torch.nn.Linear)
    assert (model.in_features, model.out_features) == (3, 2)
