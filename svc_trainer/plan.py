"""What one training run is given and what it gives back.

Plain, picklable data shared by the worker, the framework runners
(``backends.torch.runner``, ``backends.tensorflow.runner``) and the processes
they start. No Kafka, no framework imports here.

A framework's ``Runner`` (``runners.py`` names them) is called by a warm
executor (``executor.py``) trial after trial. ``run(spec, data, channel)``
trains ``spec.epochs`` epochs from the last checkpoint in
``spec.checkpoint_dir`` (or from scratch), writes a checkpoint after every
epoch *before* calling ``channel.epoch``, asks ``channel.stop_requested()``
between epochs (and may between batches), and exports the model into
``spec.export_dir`` when every epoch ran. Configuration faults raise
TrialError; anything else is the machine's fault and is reported as retryable.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from shared.errors import AistackError
from shared.settings import SparkSettings

ParamScalar = float | int | str | bool

#: A checkpoint file a runner is still writing ends in this; it is renamed
#: into place once whole, and the worker's uploads leave it out.
PARTIAL_SUFFIX = ".partial"


class TrialError(AistackError):
    """The trial cannot be trained as asked (unknown dataset, model, strategy
    or metric; parameters outside what the model accepts; the user's code
    failing). Reported as a failure, by default not retryable: the tuner
    quarantines the configuration instead of retrying it.

    ``traceback``: the last lines of the traceback that explains it (the
    user's code's). ``fatal_to_study``: the study's code, data or settings
    are at fault, not the trial's parameters, so every trial would fail the
    same way and the tuner ends the study."""

    reason = "invalid_trial"

    def __init__(
        self,
        message: str,
        *,
        reason: str | None = None,
        retryable: bool = False,
        traceback: str = "",
        fatal_to_study: bool = False,
    ) -> None:
        super().__init__(message, reason=reason)
        self.retryable = retryable
        self.traceback = traceback
        self.fatal_to_study = fatal_to_study

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword arguments do not survive pickling on their own (a rank's
        # error crossing to its driver).
        return (
            _trial_error,
            (self.message, self.reason, self.retryable, self.traceback, self.fatal_to_study),
        )


def _trial_error(
    message: str, reason: str, retryable: bool, traceback: str, fatal_to_study: bool
) -> TrialError:
    return TrialError(
        message,
        reason=reason,
        retryable=retryable,
        traceback=traceback,
        fatal_to_study=fatal_to_study,
    )


class StopReason(enum.IntEnum):
    NONE = 0
    # The tuner's pruner judged the trial unpromising: report it pruned.
    PRUNE = 1
    # The study was stopped: report it pruned at the step reached.
    STOP = 2
    # The trainer is shutting down (SIGTERM): hand the trial back, report nothing.
    SHUTDOWN = 3


TASK_CLASSIFICATION = "classification"
TASK_REGRESSION = "regression"

# A CNN's conv block halves the map (2x2 max-pool) while it is at least this
# wide: MNIST's 28 -> 14 -> 7, digits' 8 -> 4, keeping a small map's detail.
POOL_MIN_WIDTH = 8

ACTIVATIONS = ("relu", "tanh", "elu", "gelu", "sigmoid")
OPTIMIZERS = ("adam", "adamw", "sgd", "rmsprop")


@dataclass(frozen=True)
class Hyperparams:
    """The article's hyperparameters with the defaults the demo calls "the
    default configuration". CNN: conv_layers x (conv kernel_width, filters,
    activation, 2x2 max-pool while the map is >= 8 wide), then dense_layers x
    (units, activation, dropout), then the head; while training, ``augment``
    of the images (a fraction, 0: none) are shifted by up to one pixel each
    way. MLP: the dense part only."""

    learning_rate: float = 2e-3
    dropout: float = 0.25
    conv_layers: int = 2
    filters: int = 64
    kernel_width: int = 3
    dense_layers: int = 1
    units: int = 128
    activation: str = "relu"
    optimizer: str = "adam"
    batch_size: int = 32
    weight_decay: float = 0.0
    momentum: float = 0.9
    augment: float = 0.0

    @classmethod
    def from_params(cls, params: Mapping[str, ParamScalar], *, others: bool = False) -> Hyperparams:
        """Validate a trial's parameters; out-of-range values raise
        TrialError naming the parameter, and so do unknown names unless
        ``others`` (a user's model takes parameters of its own)."""
        known = {f.name: f for f in fields(cls)}
        values: dict[str, Any] = {}
        for name, value in params.items():
            spec = known.get(name)
            if spec is None:
                if others:
                    continue
                raise TrialError(
                    f"unknown parameter {name!r}; the trainer accepts {sorted(known)}",
                    reason="invalid_params",
                )
            values[name] = _coerce(name, value, spec.type)
        hp = cls(**values)
        hp._check()
        return hp

    def _check(self) -> None:
        def bad(name: str, expected: str) -> TrialError:
            return TrialError(
                f"{name}={getattr(self, name)!r}: expected {expected}", reason="invalid_params"
            )

        if not 0 < self.learning_rate <= 10:
            raise bad("learning_rate", "0 < learning_rate <= 10")
        if not 0 <= self.dropout < 1:
            raise bad("dropout", "0 <= dropout < 1")
        if not 0 <= self.conv_layers <= 6:
            raise bad("conv_layers", "0..6")
        if not 1 <= self.filters <= 1024:
            raise bad("filters", "1..1024")
        if not (1 <= self.kernel_width <= 15 and self.kernel_width % 2 == 1):
            raise bad("kernel_width", "an odd width 1..15")
        if not 0 <= self.dense_layers <= 8:
            raise bad("dense_layers", "0..8")
        if not 1 <= self.units <= 8192:
            raise bad("units", "1..8192")
        if self.activation not in ACTIVATIONS:
            raise bad("activation", f"one of {ACTIVATIONS}")
        if self.optimizer not in OPTIMIZERS:
            raise bad("optimizer", f"one of {OPTIMIZERS}")
        if not 1 <= self.batch_size <= 65536:
            raise bad("batch_size", "1..65536")
        if not 0 <= self.weight_decay < 1:
            raise bad("weight_decay", "0 <= weight_decay < 1")
        if not 0 <= self.momentum < 1:
            raise bad("momentum", "0 <= momentum < 1")
        if not 0 <= self.augment <= 1:
            raise bad("augment", "0 <= augment <= 1")


def _coerce(name: str, value: ParamScalar, kind: Any) -> Any:
    kind_name = kind if isinstance(kind, str) else kind.__name__
    if kind_name == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TrialError(f"{name}={value!r}: expected a number", reason="invalid_params")
        if not math.isfinite(float(value)):
            raise TrialError(f"{name}={value!r}: expected a finite number", reason="invalid_params")
        return float(value)
    if kind_name == "int":
        if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
            raise TrialError(f"{name}={value!r}: expected an integer", reason="invalid_params")
        return int(value)
    if not isinstance(value, str):
        raise TrialError(f"{name}={value!r}: expected a string", reason="invalid_params")
    return value


@dataclass(frozen=True)
class TensorSig:
    """One model input or output in Open Inference Protocol terms."""

    name: str
    datatype: str  # "FP32", "INT64", ...
    shape: tuple[int, ...]  # -1 for any size; the batch dimension first


@dataclass(frozen=True)
class DataSplits:
    """A dataset in fixed, seeded train/validation/test splits.

    Classification: ``x`` float32 images (N, H, W) scaled to [0, 1], ``y``
    int64 labels in [0, n_classes). Regression: ``x`` float32 (N, features),
    ``y`` float32 (N,)."""

    name: str
    # Changes whenever the data does (a content hash, or the source's version).
    version: str
    task: str  # TASK_CLASSIFICATION | TASK_REGRESSION
    x_train: NDArray[np.float32]
    y_train: NDArray[Any]
    x_val: NDArray[np.float32]
    y_val: NDArray[Any]
    x_test: NDArray[np.float32]
    y_test: NDArray[Any]
    n_classes: int = 0
    # Bus positions the data reached: (topic, partition, offset).
    offsets: tuple[tuple[str, int, int], ...] = ()
    # Where it came from, for lineage: "sklearn digits", a path, ...
    source: str = ""
    # The files it was read from, for lineage (the offline store's Parquet files).
    files: tuple[str, ...] = ()
    # For window features with one lag: the online-store field (e.g.
    # "temperature@tumbling-60s") whose latest window is one row of x, so the
    # model server can feed the model by entity.
    feature: str = ""
    # Window features: the ``aistack.v1.TrainingDistribution``
    # (``shared.distribution``) of the windows x_train's examples read, and of
    # those x_train + x_val read (what a refit trains on), as protobuf JSON:
    # plain text, so the splits still travel as JSON to TensorFlow's workers.
    # "" for other datasets.
    distribution: str = ""
    train_val_distribution: str = ""
    # What a table's columns were, for the user's code and the lineage: the
    # feature columns in x's order, the label column, and the source's class
    # names (y holds their indices); how the rows were split.
    feature_names: tuple[str, ...] = ()
    label: str = ""
    class_names: tuple[str, ...] = ()
    split: str = ""


@dataclass(frozen=True)
class CodeRef:
    """A shipped code package as a trial's processes find it: unpacked in
    ``directory`` on the trainer's host, else fetched from ``uri`` and checked
    against ``sha256`` (a rank on another host)."""

    uri: str
    sha256: str
    directory: str


#: How a multi-process trial's processes start (``task.options``): "local"
#: (the default: on this node) or "spark" (as Spark barrier tasks: a torch
#: ``ddp`` trial's ranks, ``backends.torch.spark``; a tensorflow
#: ``multi_worker_mirrored`` trial's workers, ``backends.tensorflow.spark``).
LAUNCHER_OPTION = "launcher"


@dataclass(frozen=True)
class RunSpec:
    """Everything a runner needs for one attempt of one trial."""

    trial_id: str
    study_id: str
    trial_number: int
    attempt: int
    dataset: str
    model_family: str  # "cnn" | "mlp"
    framework: str  # "torch" | "tensorflow"
    strategy: str
    world_size: int
    epochs: int
    hparams: Hyperparams
    seed: int
    # The metric the tuner optimises; must be one of the runner's metric names.
    objective_metric: str
    # Local directories: the trial's checkpoints (kept across attempts), an
    # empty directory for the exported model, this trial's TensorBoard run.
    checkpoint_dir: str
    export_dir: str
    tensorboard_dir: str
    device: str = "auto"  # "auto" | "cpu" | "cuda"
    # Intra-op threads per training process; 0 leaves the framework's default.
    threads: int = 0
    # Multi-node TensorFlow: a TF_CONFIG cluster (JSON) naming the other
    # hosts. Empty: this node only.
    tf_config: str = ""
    options: Mapping[str, str] = field(default_factory=dict)
    # False: train and evaluate only (a cross-validation fold), no model.
    export: bool = True
    # A ``launcher: spark`` trial's Spark (the trainer's AISTACK_SPARK_*) and
    # the directory its driver's JVM runs in. None: this trainer runs no Spark.
    spark: SparkSettings | None = None
    spark_work_dir: str = ""
    # The model to measure the trial's model against (``task.baseline``), as
    # protobuf JSON ("" for none; JSON for the same reason as
    # ``DataSplits.distribution``), and the directory its artifact is
    # fetched into ("": a temporary one).
    baseline: str = ""
    baseline_dir: str = ""
    # The user's code ("package.module:function"): a model builder the
    # platform's loop trains, or a training loop that trains by itself;
    # "" for the built-in families. ``params``: every parameter of the trial,
    # as the user's code receives them; ``code``: the shipped package
    # holding the code (None: installed in the environment).
    model: str = ""
    entrypoint: str = ""
    params: Mapping[str, ParamScalar] = field(default_factory=dict)
    code: CodeRef | None = None

    @property
    def launcher(self) -> str:
        """How a multi-process run's processes start: "local" or "spark"
        (``options["launcher"]``), checked where the spec is built
        (``svc_trainer.trials.run_spec``): the backends read it as it is."""
        return self.options.get(LAUNCHER_OPTION, "") or "local"


@dataclass(frozen=True)
class RunResult:
    epochs_completed: int
    # Set when the run ended before its last epoch.
    stopped: StopReason = StopReason.NONE
    # The last epoch's metrics (the objective among them) and the test split's.
    val_metrics: Mapping[str, float] = field(default_factory=dict)
    test_metrics: Mapping[str, float] = field(default_factory=dict)
    # Where the runner exported the model (spec.export_dir) when it finished.
    export_format: str = ""  # "torchscript" | "torch_export" | "tf_saved_model"
    inputs: tuple[TensorSig, ...] = ()
    outputs: tuple[TensorSig, ...] = ()
    # Data-parallel runs: the sha256 of each replica's final weights, in rank
    # order (all equal when the replicas stayed in sync).
    replica_digests: tuple[str, ...] = ()


@dataclass(frozen=True)
class DataRequest:
    """What a trial trains on (``svc_trainer.data.datasets.load``'s arguments)."""

    dataset: str
    options: Mapping[str, str] = field(default_factory=dict)
    features_path: str = ""
    seed: int = 0


@dataclass(frozen=True)
class DataLoaded:
    """What the data turned out to be, for the model's lineage."""

    name: str
    version: str
    source: str
    offsets: tuple[tuple[str, int, int], ...]
    feature: str = ""
    # Rows the model trained on (train, or train + validation for a refit).
    train_examples: int = 0
    files: tuple[str, ...] = ()
    # ``DataSplits.distribution`` of what the model trained on ("" for none).
    distribution: str = ""
    # ``DataSplits.feature_names``, ``label``, ``split``.
    features: tuple[str, ...] = ()
    label: str = ""
    split: str = ""


class Channel(Protocol):
    """The runner's line to the worker (and so to the tuner)."""

    def started(self, resumed_from_step: int, note: str = "") -> None:
        """Training begins at ``resumed_from_step`` + 1; ``note`` says why a
        checkpoint was not used (missing, corrupt)."""

    def epoch(self, step: int, metrics: Mapping[str, float]) -> None:
        """Epoch ``step`` (1-based) ended and its checkpoint is written.
        ``metrics`` holds loss, the validation metrics and samples_per_s."""

    def stop_requested(self) -> StopReason:
        """Whether to stop now; cheap enough to ask between batches."""


class SilentChannel:
    """The channel of a rank or worker other than the chief: it reports
    nothing and never asks to stop (the chief's decision reaches it through
    the strategy's collectives)."""

    def started(self, resumed_from_step: int, note: str = "") -> None:
        pass

    def epoch(self, step: int, metrics: Mapping[str, float]) -> None:
        pass

    def stop_requested(self) -> StopReason:
        return StopReason.NONE


@runtime_checkable
class Runner(Protocol):
    """A framework's trainer, as a warm executor calls it.

    An executor calls ``warm_up`` once, then ``run`` and ``release`` for
    each trial, for as long as the process lives."""

    #: The framework's name in trial requests ("torch", "tensorflow", ...).
    name: str

    def warm_up(self, threads: int) -> None:
        """Pay the one-time costs before the first trial: import the
        framework, set its process-wide threads (0: its default), compile
        what every trial would otherwise compile first."""

    def fresh_process(self, spec: RunSpec) -> bool:
        """Whether ``spec`` needs a process whose framework runtime never ran
        (its strategy configures the runtime for good); such a trial runs in
        a process of its own, which exits after it."""

    def run(self, spec: RunSpec, data: DataSplits, channel: Channel) -> RunResult:
        """Train, checkpoint and export as the module docstring says."""

    def release(self) -> None:
        """Free what the last trial left: framework state, graphs, GPU memory.
        Called after every trial, whatever became of it."""


def check_replicas_fit(strategy: str, replicas: int, gpus: int) -> None:
    """Refuse (TrialError, invalid_params) more replicas of a data-parallel
    strategy on a node than it has GPUs. NCCL cannot put two ranks on one GPU
    ("Duplicate GPU detected"), and sharing a GPU through gloo would stage
    every all-reduce in host memory and run slower than one replica alone:
    a trial asking for more processes than GPUs is a mistake worth naming,
    as torchrun users know it. ``gpus == 0`` (a CPU run) refuses nothing."""
    if gpus and replicas > gpus:
        raise TrialError(
            f"{strategy}: world_size {replicas} on this node, but it has {gpus} GPU(s); "
            f"one replica per GPU: set task.world_size to at most {gpus}, or device cpu",
            reason="invalid_params",
        )


def classification_metrics(loss: float, val_loss: float, val_accuracy: float) -> dict[str, float]:
    """Names every runner reports for a classifier (the objective picks one)."""
    return {
        "loss": loss,
        "val_loss": val_loss,
        "val_accuracy": val_accuracy,
        "val_error": 1.0 - val_accuracy,
    }


def regression_metrics(loss: float, val_mse: float, val_mae: float) -> dict[str, float]:
    return {
        "loss": loss,
        "val_loss": val_mse,
        "val_mse": val_mse,
        "val_rmse": math.sqrt(val_mse),
        "val_mae": val_mae,
    }


def as_test_metrics(val_style: Mapping[str, float]) -> dict[str, float]:
    """The test split's metrics under test_ names, from val_-style names."""
    return {
        "test_" + name.removeprefix("val_"): value
        for name, value in val_style.items()
        if name.startswith("val_")
    }


def learning_rate(base: float, epoch: int, epochs: int) -> float:
    """Cosine decay over the run, by epoch (1-based): a function of the epoch
    alone, so a resumed run continues the same schedule. The last epoch
    trains at a tenth of ``base`` or more, never at zero."""
    progress = (epoch - 1) / max(epochs, 1)
    return base * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
