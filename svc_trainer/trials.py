"""From a trial request to a run, and from a run to reports and a model-ready
event. Pure: no Kafka, no frameworks.

A trial's model is named by its task (``task.model_name``, else the study id)
and versioned by trial number + 1, so versions rise with the study and a
retried or redelivered trial republishes the same version (idempotent).
"""

from __future__ import annotations

import zlib
from collections.abc import Collection, Mapping
from pathlib import Path

from google.protobuf import json_format
from google.protobuf.timestamp_pb2 import Timestamp

from shared.contracts.aistack.v1 import common_pb2, models_pb2, tuning_pb2
from shared.feature_store import FEATURE_LABEL
from shared.objective import BASELINE_VERSION, REFIT, VERSION_OFFSET, is_refit
from shared.settings import SparkSettings
from svc_trainer import evaluation
from svc_trainer.plan import (
    LAUNCHER_OPTION,
    DataLoaded,
    DataRequest,
    Hyperparams,
    ParamScalar,
    RunResult,
    RunSpec,
    TrialError,
)

_FRAMEWORKS = {
    common_pb2.FRAMEWORK_TORCH: "torch",
    common_pb2.FRAMEWORK_TENSORFLOW: "tensorflow",
}
_FORMATS = {
    "torch_export": models_pb2.ARTIFACT_FORMAT_TORCH_EXPORT,
    "torchscript": models_pb2.ARTIFACT_FORMAT_TORCHSCRIPT,
    "tf_saved_model": models_pb2.ARTIFACT_FORMAT_TF_SAVED_MODEL,
}
DEFAULT_MODEL_FAMILY = {"features": "mlp"}


def params(request: tuning_pb2.TrialRequested) -> dict[str, ParamScalar]:
    out: dict[str, ParamScalar] = {}
    for name, value in request.params.items():
        kind = value.WhichOneof("kind")
        if kind is None:
            raise TrialError(f"parameter {name!r} has no value", reason="invalid_params")
        out[name] = getattr(value, kind)
    return out


#: A study may search over frameworks too: a string parameter of this name
#: ("torch" or "tensorflow") overrides the task's framework for its trial.
FRAMEWORK_PARAM = "framework"


#: The launchers (``RunSpec.launcher``, ``LAUNCHER_OPTION``).
LAUNCHERS = ("local", "spark")
ON_SPARK = (("torch", "ddp"), ("tensorflow", "multi_worker_mirrored"))


def launcher(spec: RunSpec) -> str:
    """The launcher ``spec`` asks for, checked (``run_spec`` checks every
    spec it builds); TrialError (invalid_params) for an unknown one, or
    "spark" on a trial Spark does not launch (``ON_SPARK``)."""
    name = spec.launcher
    if name not in LAUNCHERS:
        raise TrialError(
            f'options["{LAUNCHER_OPTION}"]={name!r}: expected one of {", ".join(LAUNCHERS)}',
            reason="invalid_params",
        )
    if name == "spark" and (spec.framework, spec.strategy) not in ON_SPARK:
        raise TrialError(
            f'options["{LAUNCHER_OPTION}"]="spark" runs torch ddp and tensorflow '
            f"multi_worker_mirrored trials only, not {spec.framework} "
            f"{spec.strategy or 'default'}",
            reason="invalid_params",
        )
    return name


#: A cross-validation's fold as a trial parameter (a grid over it spreads one
#: cross-validation over the trainers): passed to the run as an option.
CV_FOLD_PARAM = evaluation.CV_FOLD


def framework_name(request: tuning_pb2.TrialRequested) -> str:
    chosen = request.params.get(FRAMEWORK_PARAM)
    if chosen is not None and chosen.WhichOneof("kind") == "string_value":
        return chosen.string_value
    return _FRAMEWORKS.get(request.task.framework, "")


def framework_enum(request: tuning_pb2.TrialRequested) -> common_pb2.Framework:
    by_name = {name: enum for enum, name in _FRAMEWORKS.items()}
    return by_name.get(framework_name(request), common_pb2.FRAMEWORK_UNSPECIFIED)


def model_family(request: tuning_pb2.TrialRequested) -> str:
    """The task's model family, else the dataset's usual one; "" for a
    model or a training loop of the user's."""
    task = request.task
    if task.model or task.entrypoint:
        return ""
    return task.model_family or DEFAULT_MODEL_FAMILY.get(task.dataset, "cnn")


def user_code(request: tuning_pb2.TrialRequested) -> str:
    """The user's function the trial runs ("package.module:function"), if any."""
    return request.task.entrypoint or request.task.model


def model_name(request: tuning_pb2.TrialRequested) -> str:
    return request.task.model_name or request.study_id


def model_version(request: tuning_pb2.TrialRequested) -> str:
    """The trial's model version: its number + 1, after the request's
    ``VERSION_OFFSET`` (a re-tune's). TrialError for an offset that is not a
    non-negative integer."""
    text = request.task.options.get(VERSION_OFFSET, "0") or "0"
    if not text.isdigit():
        raise TrialError(
            f'options["{VERSION_OFFSET}"]={text!r}: expected a non-negative integer',
            reason="invalid_params",
        )
    return str(int(text) + request.trial_number + 1)


def trial_key(request: tuning_pb2.TrialRequested) -> str:
    """A path-safe key for the trial's checkpoints and runs."""
    return f"{safe_name(request.study_id)}/{request.trial_number}"


def run_spec(
    request: tuning_pb2.TrialRequested,
    *,
    checkpoint_dir: Path,
    export_dir: Path,
    tensorboard_dir: Path,
    device: str,
    threads: int,
    world_size: int,
    tf_config: str = "",
    frameworks: Collection[str] = ("torch", "tensorflow"),
    spark: SparkSettings | None = None,
    spark_work_dir: Path | None = None,
    baseline_dir: Path | None = None,
    code_cache: Path | None = None,
) -> RunSpec:
    """The run for ``request``; TrialError for what no trainer can train.
    ``frameworks``: the runners this trainer has; ``spark``: where a
    ``launcher: spark`` trial runs (None: nowhere); ``baseline_dir``: where
    a ``task.baseline``'s artifact is fetched (None: a temporary directory);
    ``code_cache``: where shipped code packages are unpacked, by digest."""
    task = request.task
    check_user_code(task)
    framework = framework_name(request)
    if framework not in frameworks:
        raise TrialError(
            f"framework {framework or task.framework!r}: expected FRAMEWORK_TORCH or "
            f"FRAMEWORK_TENSORFLOW (or a {FRAMEWORK_PARAM!r} parameter: "
            f"{', '.join(frameworks)})",
            reason="unknown_framework",
        )
    if not task.dataset and not task.entrypoint:
        raise TrialError("task.dataset is empty", reason="unknown_dataset", fatal_to_study=True)
    if task.epochs < 1:
        raise TrialError(f"task.epochs={task.epochs}: expected at least 1", reason="invalid_params")
    if not request.objective.metric:
        raise TrialError("the trial names no objective metric", reason="unknown_metric")
    model_version(request)  # a bad version offset fails before training, not after
    seed = request.seed if request.HasField("seed") else zlib.crc32(request.trial_id.encode())
    given = params(request)
    options = dict(task.options)
    if CV_FOLD_PARAM in given:
        options[CV_FOLD_PARAM] = str(given[CV_FOLD_PARAM])
    hyperparams = {k: v for k, v in given.items() if k not in (FRAMEWORK_PARAM, CV_FOLD_PARAM)}
    if task.entrypoint:
        # The user's loop reads its parameters itself: none is the platform's.
        hparams = Hyperparams()
    else:
        hparams = Hyperparams.from_params(hyperparams, others=bool(task.model))
    code = None
    if task.HasField("code"):
        from svc_trainer.user_code.packages import code_ref

        code = code_ref(task.code, code_cache or Path(checkpoint_dir).parent / "code")
    spec = RunSpec(
        trial_id=request.trial_id,
        study_id=request.study_id,
        trial_number=request.trial_number,
        attempt=request.attempt,
        dataset=task.dataset,
        model_family=model_family(request),
        framework=framework,
        strategy=task.strategy,
        world_size=task.world_size or world_size,
        epochs=task.epochs,
        hparams=hparams,
        seed=seed % (2**31),
        objective_metric=request.objective.metric,
        checkpoint_dir=str(checkpoint_dir),
        export_dir=str(export_dir),
        tensorboard_dir=str(tensorboard_dir),
        device=device,
        threads=threads,
        tf_config=tf_config,
        options=options,
        spark=spark,
        spark_work_dir=str(spark_work_dir or ""),
        baseline=(
            json_format.MessageToJson(task.baseline, indent=None)
            if task.HasField("baseline")
            else ""
        ),
        baseline_dir=str(baseline_dir or ""),
        model=task.model,
        entrypoint=task.entrypoint,
        params=hyperparams,
        code=code,
    )
    launcher(spec)
    return spec


def check_user_code(task: tuning_pb2.TrainingTask) -> None:
    """TrialError (fatal to the study) for a task naming the user's code in a
    way no trainer can run (``shared.code_refs.task_problem``)."""
    from shared import code_refs

    problem = code_refs.task_problem(task)
    if problem is not None:
        field, what = problem
        raise TrialError(f"{field}: {what}", reason="invalid_task", fatal_to_study=True)


def data_request(
    request: tuning_pb2.TrialRequested, *, features_path: str, mnist_path: str
) -> DataRequest:
    options = dict(request.task.options)
    if request.task.dataset == "mnist" and mnist_path:
        options.setdefault("path", mnist_path)
    # One split for every trial of a study, so their metrics compare.
    return DataRequest(request.task.dataset, options, features_path=features_path, seed=0)


def objective_value(result: RunResult, metric: str) -> float:
    value = result.val_metrics.get(metric)
    if value is None:
        raise TrialError(f"the run reported no {metric!r}", reason="unknown_metric")
    return float(value)


def model_ready(
    request: tuning_pb2.TrialRequested,
    result: RunResult,
    data: DataLoaded | None,
    *,
    artifact_uri: str,
    sha256: str,
    size_bytes: int,
    trainer_id: str,
) -> models_pb2.ModelReady:
    created = Timestamp()
    created.GetCurrentTime()
    task = request.task
    lineage = models_pb2.ModelLineage(
        study_id=request.study_id,
        trial_id=request.trial_id,
        trial_number=request.trial_number,
        data=models_pb2.DataLineage(
            dataset=f"{data.name}@{data.version}" if data and data.name else task.dataset,
            offsets=[
                common_pb2.SourcePosition(topic=t, partition=p, offset=o)
                for t, p, o in (data.offsets if data else ())
            ],
            files=list(data.files) if data else [],
            features=list(data.features) if data else [],
            label=data.label if data else "",
            split=data.split if data else "",
        ),
    )
    if task.model or task.entrypoint or task.HasField("code"):
        lineage.code.model = task.model
        lineage.code.entrypoint = task.entrypoint
        if task.HasField("code"):
            lineage.code.package.CopyFrom(task.code)
    for name, value in request.params.items():
        lineage.params[name].CopyFrom(value)
    distribution = models_pb2.TrainingDistribution()
    if data is not None and data.distribution:
        json_format.Parse(data.distribution, distribution)
    return models_pb2.ModelReady(
        model_name=model_name(request),
        version=model_version(request),
        framework=framework_enum(request),
        format=_FORMATS[result.export_format],
        artifact_uri=artifact_uri,
        sha256=sha256,
        size_bytes=size_bytes,
        inputs=[_tensor(s.name, s.datatype, s.shape) for s in result.inputs],
        outputs=[_tensor(s.name, s.datatype, s.shape) for s in result.outputs],
        metrics={**result.val_metrics, **result.test_metrics},
        objective=request.objective,
        lineage=lineage,
        created_time=created,
        labels=_labels(request, data, trainer_id),
        training_distribution=distribution if distribution.ByteSize() else None,
    )


def report(
    request: tuning_pb2.TrialRequested, trainer_id: str, **event: object
) -> tuning_pb2.TrialReport:
    now = Timestamp()
    now.GetCurrentTime()
    return tuning_pb2.TrialReport(
        trial_id=request.trial_id,
        study_id=request.study_id,
        attempt=request.attempt,
        trainer_id=trainer_id,
        report_time=now,
        **event,  # type: ignore[arg-type]
    )


def progress_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    """Finite values only (protobuf carries NaN, but dashboards choke on it)."""
    return {k: float(v) for k, v in metrics.items() if v == v and abs(v) != float("inf")}


def _tensor(name: str, datatype: str, shape: tuple[int, ...]) -> models_pb2.TensorSpec:
    return models_pb2.TensorSpec(name=name, datatype=datatype, shape=list(shape))


def _labels(
    request: tuning_pb2.TrialRequested, data: DataLoaded | None, trainer_id: str
) -> dict[str, str]:
    labels = {
        "strategy": request.task.strategy or "default",
        "model_family": model_family(request) or "user",
        "dataset_version": data.version if data else "",
        "dataset_source": data.source if data else "",
        "trainer": trainer_id,
        "attempt": str(request.attempt),
        REFIT: "true" if is_refit(request.task.options) else "false",
        "train_examples": str(data.train_examples) if data else "",
    }
    if user_code(request):
        labels["user_code"] = user_code(request)
    if request.task.HasField("code"):
        labels["code_sha256"] = request.task.code.sha256
    if data is not None and data.feature:
        labels[FEATURE_LABEL] = data.feature
    if request.task.HasField("baseline"):
        # With the metric baseline_<objective>: the champion rule's evidence.
        labels[BASELINE_VERSION] = request.task.baseline.version
    return labels


def safe_name(text: str) -> str:
    """``text`` usable as one path component (study ids, model names)."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text) or "_"
