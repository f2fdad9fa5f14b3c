"""svc_trainer's TensorFlow runner: ``run(spec, data, channel)`` per ``plan``.

Strategies (``spec.strategy``):

- ``one_device`` (also ``single`` and ``""``): OneDeviceStrategy on the first
  GPU (unless ``spec.device == "cpu"``), else the CPU; Keras ``model.fit``.
- ``mirrored``: MirroredStrategy over the local GPUs (NCCL all-reduce) or, on a
  CPU-only host, over ``world_size`` (default 2) logical CPU devices.
- ``central_storage``: CentralStorageStrategy: the variables live on one
  device (the CPU, or the one GPU when there is a single one) and the compute
  is mirrored over the local GPUs, or ``world_size`` (default 2) logical CPU
  devices; Keras ``model.fit``.
- ``multi_worker_mirrored``: synchronous data parallelism over ``world_size``
  (default: one per GPU, else 2) worker processes: this process is worker 0,
  the others are started by ``tf_cluster`` on free localhost ports (or
  ``spec.tf_config`` names a multi-node cluster). RING collectives on CPUs;
  NCCL on GPUs, one GPU per worker (more workers than GPUs is refused). At the
  end of each epoch the chief's stop decision is all-reduced, so every worker
  stops after the same epoch.
- ``parameter_server``: asynchronous ParameterServerStrategy. This process is
  the coordinator; ``options["ps"]`` (default 1) parameter servers and
  ``world_size`` (default 1) workers run as ``tf.distribute.Server`` children.
  Keras 3's ``fit`` has no ParameterServerStrategy support, so a custom loop
  schedules per-worker steps with a ``ClusterCoordinator``.

In every strategy the global batch is ``hparams.batch_size`` (split over the
replicas), so a trial means the same optimisation whatever runs it. Only the
chief talks to the channel, restores and writes ``spec.checkpoint_dir`` and
exports. ``train`` is ``run`` without the export; it returns the trained
Keras model, which outputs logits (classification) or the prediction
(regression) — the export adds the softmax.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import math
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import numpy as np
from numpy.typing import NDArray

from shared.log import get_logger
from svc_trainer import tf_cluster, tf_models
from svc_trainer.plan import (
    TASK_CLASSIFICATION,
    Channel,
    DataSplits,
    RunResult,
    RunSpec,
    SilentChannel,
    StopReason,
    TensorSig,
    TrialError,
    as_test_metrics,
    check_replicas_fit,
    classification_metrics,
    learning_rate,
    regression_metrics,
)
from svc_trainer.tf_cluster import LocalCluster, Role

log = get_logger("svc_trainer")

ONE_DEVICE = "one_device"
MIRRORED = "mirrored"
CENTRAL_STORAGE = "central_storage"
MULTI_WORKER = "multi_worker_mirrored"
PARAMETER_SERVER = "parameter_server"
STRATEGIES = (ONE_DEVICE, MIRRORED, CENTRAL_STORAGE, MULTI_WORKER, PARAMETER_SERVER)
# One process, Keras fit, replicas on this node's devices.
_LOCAL_STRATEGIES = (ONE_DEVICE, MIRRORED, CENTRAL_STORAGE)
_ALIASES = {"": ONE_DEVICE, "single": ONE_DEVICE}
EXPORT_FORMAT = "tf_saved_model"
CHECKPOINTS_KEPT = 2
# Between batches the channel is asked at most this often: a stop need not land
# faster than a tenth of a second, and fewer calls keep the step loop tight.
STOP_CHECK_INTERVAL_S = 0.1
# Workers run the same final evaluation as the chief and then exit by themselves.
WORKERS_EXIT_TIMEOUT_S = 60.0
_CHECKPOINT_NAME = "ckpt"


# -- the contract's checks ---------------------------------------------------------------


def metric_names(task: str) -> tuple[str, ...]:
    """The names of every epoch's metrics for ``task``."""
    if task == TASK_CLASSIFICATION:
        return (*classification_metrics(0.0, 0.0, 0.0), "samples_per_s")
    return (*regression_metrics(0.0, 0.0, 0.0), "samples_per_s")


def strategy_of(spec: RunSpec) -> str:
    """The canonical strategy name; TrialError(unknown_strategy) otherwise."""
    name = _ALIASES.get(spec.strategy, spec.strategy)
    if "tpu" in name.lower():
        raise TrialError(
            f"strategy {spec.strategy!r}: TPUStrategy needs a TPU host (a TPU VM or a "
            "Cloud TPU node); this runner trains on CPUs and GPUs",
            reason="unknown_strategy",
        )
    if name not in STRATEGIES:
        raise TrialError(
            f"unknown TensorFlow strategy {spec.strategy!r}; known: {', '.join(STRATEGIES)}",
            reason="unknown_strategy",
        )
    return name


def check(spec: RunSpec, data: DataSplits) -> str:
    """Every configuration check, before anything starts; returns the strategy.

    Raises TrialError: unknown_strategy, unknown_model, invalid_params (the
    model does not fit the data; a bad tf_config; no GPU for device="cuda"),
    unknown_metric (the objective is not one of ``metric_names``)."""
    strategy = strategy_of(spec)
    tf_models.check_fits(spec.model_family, data)
    names = metric_names(data.task)
    if spec.objective_metric not in names:
        raise TrialError(
            f"objective {spec.objective_metric!r} is not a metric of this run; "
            f"it reports {list(names)}",
            reason="unknown_metric",
        )
    if spec.epochs < 0:
        raise TrialError(f"epochs={spec.epochs}: expected >= 0", reason="invalid_params")
    if spec.device not in ("auto", "cpu", "cuda"):
        raise TrialError(
            f"device {spec.device!r}: expected auto, cpu or cuda", reason="invalid_params"
        )
    if spec.device == "cuda" and not _tf().config.list_physical_devices("GPU"):
        raise TrialError("device=cuda but this host has no GPU", reason="invalid_params")
    if strategy == PARAMETER_SERVER:
        _ps_count(spec)
    if strategy == MULTI_WORKER and not spec.tf_config:
        check_replicas_fit(strategy, _local_workers(spec), _local_gpus(spec))
    elif strategy in (MIRRORED, CENTRAL_STORAGE):
        check_replicas_fit(strategy, spec.world_size, _local_gpus(spec))
    _given_role(spec, strategy)
    return strategy


def _local_gpus(spec: RunSpec) -> int:
    """The GPUs a trial on this host trains on (none with ``device: cpu``)."""
    return 0 if spec.device == "cpu" else len(_tf().config.list_physical_devices("GPU"))


def _local_workers(spec: RunSpec) -> int:
    """A local MultiWorkerMirrored cluster's size: ``world_size``, else one
    worker per GPU, else 2."""
    return spec.world_size if spec.world_size > 0 else (_local_gpus(spec) or 2)


# -- run and train -----------------------------------------------------------------------


def run(spec: RunSpec, data: DataSplits, channel: Channel) -> RunResult:
    """Train (see ``train``) and, when every epoch ran, export a SavedModel
    into ``spec.export_dir`` (chief only)."""
    result, model = train(spec, data, channel)
    given = _given_role(spec, strategy_of(spec))
    if result.stopped is not StopReason.NONE or not spec.export:
        return result
    if given is not None and not given.is_chief:
        return result
    inputs, outputs = export(model, spec, data)
    return replace(result, export_format=EXPORT_FORMAT, inputs=inputs, outputs=outputs)


def train(spec: RunSpec, data: DataSplits, channel: Channel) -> tuple[RunResult, Any]:
    """Train ``spec.epochs`` epochs from the last good checkpoint; no export.

    Returns the result and the trained ``keras.Model`` (logits for a
    classifier). Meant to run in a fresh process: it configures TensorFlow
    globally (threads, logical devices, precision policy, seeds). Raises
    TrialError (before any training) for a configuration that cannot train;
    any other exception is the machine's fault. Child processes are reaped
    before it returns or raises."""
    strategy = check(spec, data)
    role = _given_role(spec, strategy) or _local_role(spec, strategy)
    log.info(
        "tf.train.begin",
        trial_id=spec.trial_id,
        strategy=strategy,
        model_family=spec.model_family,
        epochs=spec.epochs,
        tasks={k: len(v) for k, v in role.cluster.items()},
    )
    with LocalCluster(role, spec.trial_id) as cluster:
        # Children first: they import TensorFlow while this process does.
        if role.local and strategy == MULTI_WORKER:
            cluster.start_workers(spec, data)
            cluster.watch(_abort_collectives)
        elif role.local and strategy == PARAMETER_SERVER:
            cluster.start_servers()
        result, model = _train(spec, data, channel, strategy, role)
        if strategy == PARAMETER_SERVER:
            # Free the remote functions and variables while their servers still answer.
            gc.collect()
        if strategy == MULTI_WORKER and not cluster.wait(WORKERS_EXIT_TIMEOUT_S):
            log.warning("tf.workers.lingering", trial_id=spec.trial_id, pids=cluster.pids)
        if failed := cluster.failed():
            log.warning("tf.workers.failed", trial_id=spec.trial_id, tasks=failed)
    return result, model


def train_as(role: Role, spec: RunSpec, data: DataSplits, scratch: Path) -> None:
    """A non-chief MultiWorkerMirrored worker's part of ``train`` (run by
    ``tf_cluster``): same model and steps, silent; its throw-away checkpoints
    go to ``scratch`` (inside the chief's job directory, which the chief
    removes even when this worker was killed)."""
    _train(spec, data, SilentChannel(), strategy_of(spec), role, scratch)


def export(
    model: Any, spec: RunSpec, data: DataSplits
) -> tuple[tuple[TensorSig, ...], tuple[TensorSig, ...]]:
    """Write ``model`` as a SavedModel into ``spec.export_dir``: signature
    ``serving_default``, input "input" FP32 (-1, *sample shape), output
    "probabilities" (softmax, (-1, n_classes)) or "prediction" ((-1, 1)).

    The weights are copied into a fresh float32 model outside any strategy, so
    the SavedModel holds plain variables whatever trained them (and computes
    in float32 even when training used mixed precision). Returns the
    signature's (inputs, outputs) as RunResult carries them."""
    tf, keras = _tf(), _keras()
    policy = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("float32")
    try:
        served = tf_models.build_model(spec.model_family, spec.hparams, data)
    finally:
        keras.mixed_precision.set_global_policy(policy)
    served.set_weights(model.get_weights())
    sample_shape = tuple(int(d) for d in data.x_train.shape[1:])
    classify = data.task == TASK_CLASSIFICATION
    out_name = "probabilities" if classify else "prediction"

    def serve_fn(input: Any) -> dict[str, Any]:
        out = served(input, training=False)
        return {out_name: tf.nn.softmax(out, axis=-1) if classify else out}

    # The argument's name is the signature's input name.
    signature = [tf.TensorSpec((None, *sample_shape), tf.float32, name="input")]
    serve = tf.function(serve_fn, input_signature=signature)
    module = tf.Module()
    module.model = served
    module.serve = serve
    Path(spec.export_dir).mkdir(parents=True, exist_ok=True)
    tf.saved_model.save(module, spec.export_dir, signatures={"serving_default": serve})
    width = data.n_classes if classify else 1
    log.info("tf.exported", trial_id=spec.trial_id, path=spec.export_dir)
    return (
        (TensorSig("input", "FP32", (-1, *sample_shape)),),
        (TensorSig(out_name, "FP32", (-1, width)),),
    )


# -- internals -------------------------------------------------------------------------


def _tf() -> Any:
    import tensorflow as tf

    return tf


def _keras() -> Any:
    import keras

    return keras


def _abort_collectives(task: str, code: int) -> None:
    """Fail this process's pending and future collectives (a worker died):
    the run raises instead of waiting for it forever."""
    log.error("tf.worker.died", task=task, code=code)
    # TensorFlow's own peer health check (off by default) does the same.
    context: Any = importlib.import_module("tensorflow.python.eager.context")
    context.context().abort_collective_ops(
        _tf().errors.UNAVAILABLE, f"worker {task} exited with code {code}"
    )


def _ps_count(spec: RunSpec) -> int:
    text = spec.options.get("ps", "1")
    if not text.isdigit() or int(text) < 1:
        raise TrialError(f"options ps={text!r}: expected an integer >= 1", reason="invalid_params")
    return int(text)


def _given_role(spec: RunSpec, strategy: str) -> Role | None:
    """This process's task in the cluster ``spec.tf_config`` names, if any."""
    if strategy in _LOCAL_STRATEGIES or not spec.tf_config:
        return None
    role = tf_cluster.parse_tf_config(spec.tf_config)
    needs = ("worker",) if strategy == MULTI_WORKER else ("worker", "ps")
    if missing := [t for t in needs if not role.cluster.get(t)]:
        raise TrialError(
            f"tf_config for {strategy} has no {', '.join(missing)} tasks",
            reason="invalid_params",
        )
    if strategy == PARAMETER_SERVER and role.task_type != "chief":
        raise TrialError(
            "parameter_server: this process is the coordinator, so tf_config's task "
            f"must be the chief, not {role.task_type}:{role.task_index}",
            reason="invalid_params",
        )
    return role


def _local_role(spec: RunSpec, strategy: str) -> Role:
    """No cluster for a single-process strategy; else the chief of a new
    localhost cluster (fresh ports on every call)."""
    if strategy in _LOCAL_STRATEGIES:
        return Role()
    if strategy == MULTI_WORKER:
        return tf_cluster.local_multi_worker(_local_workers(spec))
    return tf_cluster.local_parameter_server(
        spec.world_size if spec.world_size > 0 else 1, _ps_count(spec)
    )


@dataclass(frozen=True)
class _Devices:
    gpus: int
    mixed_precision: bool


def _configure(spec: RunSpec, strategy: str, role: Role) -> _Devices:
    """Process-wide TensorFlow settings, before the runtime starts. In a
    process where it already started (tests) what cannot change stays."""
    tf, keras = _tf(), _keras()
    gpus = tf.config.list_physical_devices("GPU")
    try:
        if spec.device == "cpu" and gpus:
            tf.config.set_visible_devices([], "GPU")
            gpus = []
        elif gpus and role.local and strategy == MULTI_WORKER:
            # One GPU per local worker (``check`` refused more workers than GPUs).
            mine = gpus[role.task_index]
            tf.config.set_visible_devices([mine], "GPU")
            gpus = [mine]
        threading = tf.config.threading
        if spec.threads > 0 and threading.get_intra_op_parallelism_threads() != spec.threads:
            threading.set_intra_op_parallelism_threads(spec.threads)
        if strategy in (MIRRORED, CENTRAL_STORAGE) and not gpus:
            cpu = tf.config.list_physical_devices("CPU")[0]
            replicas = spec.world_size if spec.world_size > 0 else 2
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(replicas)]
            )
    except RuntimeError as exc:
        log.warning("tf.configure.late", trial_id=spec.trial_id, error=str(exc))
    mixed = bool(gpus)
    keras.mixed_precision.set_global_policy("mixed_float16" if mixed else "float32")
    keras.utils.set_random_seed(spec.seed)
    return _Devices(len(gpus), mixed)


def _strategy(spec: RunSpec, name: str, role: Role, devices: _Devices) -> Any:
    tf = _tf()
    if name == ONE_DEVICE:
        return tf.distribute.OneDeviceStrategy("/gpu:0" if devices.gpus else "/cpu:0")
    if name in (MIRRORED, CENTRAL_STORAGE):
        replicas = _replica_devices(spec, name, devices)
        if name == CENTRAL_STORAGE:
            # Variables on the CPU, unless one GPU computes alone.
            parameters = replicas[0] if len(replicas) == 1 else "/cpu:0"
            return tf.distribute.experimental.CentralStorageStrategy(
                compute_devices=replicas, parameter_device=parameters
            )
        reduce = (
            tf.distribute.NcclAllReduce() if devices.gpus else tf.distribute.ReductionToOneDevice()
        )
        return tf.distribute.MirroredStrategy(devices=replicas, cross_device_ops=reduce)
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec({k: list(v) for k, v in role.cluster.items()}),
        task_type=role.task_type,
        task_id=role.task_index,
        rpc_layer="grpc",
    )
    if name == MULTI_WORKER:
        implementation = tf.distribute.experimental.CommunicationImplementation
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=implementation.NCCL if devices.gpus else implementation.RING
        )
        return tf.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=resolver, communication_options=options
        )
    return tf.distribute.experimental.ParameterServerStrategy(resolver)


def _replica_devices(spec: RunSpec, name: str, devices: _Devices) -> list[str]:
    """The devices a one-process multi-replica strategy computes on: every
    local GPU (``world_size`` of them when set), else ``world_size`` (2)
    logical CPU devices."""
    tf = _tf()
    if devices.gpus:
        # ``check`` refused more replicas than GPUs.
        count = spec.world_size if spec.world_size > 0 else devices.gpus
        return [f"/gpu:{i}" for i in range(count)]
    replicas = spec.world_size if spec.world_size > 0 else 2
    cpus = [d.name for d in tf.config.list_logical_devices("CPU")]
    if len(cpus) < replicas:
        raise RuntimeError(
            f"{name} needs {replicas} logical CPUs, the runtime has {len(cpus)}: "
            "it started before the runner could configure them (not a fresh process)"
        )
    return cpus[:replicas]


def _train(
    spec: RunSpec,
    data: DataSplits,
    channel: Channel,
    strategy_name: str,
    role: Role,
    scratch: Path | None = None,
) -> tuple[RunResult, Any]:
    devices = _configure(spec, strategy_name, role)
    strategy = _strategy(spec, strategy_name, role, devices)
    log.info(
        "tf.strategy",
        trial_id=spec.trial_id,
        strategy=strategy_name,
        task=f"{role.task_type}:{role.task_index}" if role.cluster else "local",
        replicas=int(strategy.num_replicas_in_sync),
        gpus=devices.gpus,
        mixed_precision=devices.mixed_precision,
    )
    if strategy_name in _LOCAL_STRATEGIES:
        return _train_fit(spec, data, channel, strategy)
    return _train_custom(spec, data, channel, strategy, strategy_name, role, scratch)


def _targets(data: DataSplits, y: NDArray[Any]) -> NDArray[Any]:
    if data.task == TASK_CLASSIFICATION:
        return y.astype(np.int64)
    return y.astype(np.float32).reshape(-1, 1)


def _epoch_metrics(task: str, loss: float, val: Mapping[str, float]) -> dict[str, float]:
    """``val`` holds "loss" and "accuracy" (classification) or "loss" (MSE)
    and "mae" of the validation split."""
    if task == TASK_CLASSIFICATION:
        return classification_metrics(float(loss), float(val["loss"]), float(val["accuracy"]))
    return regression_metrics(float(loss), float(val["loss"]), float(val["mae"]))


def _test_metrics(task: str, test: Mapping[str, float]) -> dict[str, float]:
    return as_test_metrics(_epoch_metrics(task, float(test["loss"]), test))


# -- checkpoints -------------------------------------------------------------------------


class _Checkpoints:
    """The trial's checkpoints: model, optimizer and epoch counter, the last
    ``CHECKPOINTS_KEPT`` epochs.

    ``restore`` never raises for bad files: it tries the newest checkpoint,
    then older ones, puts unreadable ones aside in ``corrupt/`` and falls
    back to the initial weights (epoch 0)."""

    def __init__(self, directory: Path, model: Any, optimizer: Any) -> None:
        tf = _tf()
        self.directory = directory
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
        self._checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, epoch=self.epoch)
        self._variables = [*model.variables, *optimizer.variables, self.epoch]
        directory.mkdir(parents=True, exist_ok=True)
        self._state_unreadable = False
        try:
            self._manager = self._new_manager()
        except Exception as exc:  # the manager parses the state file: it may be garbage
            log.warning("tf.checkpoint.state_unreadable", path=str(directory), error=repr(exc))
            self._state_unreadable = True
            self._quarantine([], state_file=True)

    def _new_manager(self) -> Any:
        return _tf().train.CheckpointManager(
            self._checkpoint,
            str(self.directory),
            max_to_keep=CHECKPOINTS_KEPT,
            checkpoint_name=_CHECKPOINT_NAME,
        )

    def _candidates(self) -> list[str]:
        """Newest first: the manager's latest, then every ckpt-N on disk (the
        state file may itself be what is corrupt)."""
        found: list[tuple[int, str]] = []
        pattern = re.compile(rf"{_CHECKPOINT_NAME}-(\d+)\.index")
        for entry in self.directory.iterdir():
            if match := pattern.fullmatch(entry.name):
                found.append((int(match.group(1)), str(self.directory / entry.stem)))
        paths = [p for _, p in sorted(found, reverse=True)]
        latest = self._manager.latest_checkpoint
        if latest and latest in paths:
            paths.remove(latest)
        return [latest, *paths] if latest else paths

    def restore(self) -> tuple[int, str]:
        """(the restored epoch, a note when a checkpoint was not usable)."""
        candidates = self._candidates()
        if not candidates:
            note = "checkpoint state unreadable; starting over" if self._state_unreadable else ""
            return 0, note
        initial = [np.array(v.numpy()) for v in self._variables]
        bad: list[str] = []
        for path in candidates:
            try:
                self._checkpoint.read(path).assert_existing_objects_matched()
                step = int(self.epoch.numpy())
            except Exception as exc:  # any unreadable or foreign file: never crash on it
                log.warning("tf.checkpoint.unreadable", path=path, error=repr(exc)[:500])
                bad.append(Path(path).name)
                for variable, value in zip(self._variables, initial, strict=True):
                    variable.assign(value)
                continue
            if bad:
                self._quarantine(bad)
            unreadable = [*bad, *(["the state file"] if self._state_unreadable else [])]
            if unreadable:
                return step, f"checkpoint {', '.join(unreadable)} unreadable; resumed from {path}"
            return step, ""
        self._quarantine(bad, state_file=True)
        return 0, f"checkpoint {', '.join(bad)} unreadable (corrupt?); starting over from epoch 0"

    def _quarantine(self, names: list[str], state_file: bool = False) -> None:
        aside = self.directory / "corrupt"
        aside.mkdir(exist_ok=True)
        for entry in list(self.directory.iterdir()):
            prefix = entry.name.split(".", 1)[0]
            if prefix in names or (state_file and entry.name == "checkpoint"):
                entry.replace(aside / entry.name)
        self._manager = self._new_manager()

    def save(self, step: int) -> None:
        self.epoch.assign(step)
        self._manager.save(checkpoint_number=step)


def _chief_broadcast(strategy: Any) -> Callable[[list[Any]], list[Any]]:
    """A function giving every worker the chief's values (replica 0's) of a
    list of tensors, through one all-reduce to which the others add zeros.
    Every worker must call it at the same point, with the same structure."""
    tf = _tf()

    def replica_fn(values: list[Any]) -> Any:
        context = tf.distribute.get_replica_context()
        first = tf.equal(context.replica_id_in_sync_group, 0)
        masked = [tf.where(first, v, tf.zeros_like(v)) for v in values]
        # One all-reduce per dtype: a collective packs its tensors into one buffer.
        by_dtype: dict[Any, list[int]] = {}
        for i, value in enumerate(masked):
            by_dtype.setdefault(value.dtype, []).append(i)
        out: list[Any] = [None] * len(masked)
        for indices in by_dtype.values():
            group = [masked[i] for i in indices]
            for i, value in zip(
                indices, context.all_reduce(tf.distribute.ReduceOp.SUM, group), strict=True
            ):
                out[i] = value
        return out

    compiled = tf.function(replica_fn)

    def broadcast(tensors: list[Any]) -> list[Any]:
        reduced = strategy.run(compiled, args=(tensors,))
        return [strategy.experimental_local_results(r)[0] for r in reduced]

    return broadcast


# -- one_device and mirrored: model.fit ---------------------------------------------------


class _EpochLoop:
    """The per-epoch work of a ``model.fit`` run, as Keras callbacks: time the
    training steps, checkpoint, report, and decide whether to stop.

    A stop seen between batches abandons the epoch: it is neither
    checkpointed nor reported, so a resume repeats it."""

    def __init__(
        self,
        spec: RunSpec,
        data: DataSplits,
        channel: Channel,
        checkpoints: _Checkpoints,
        model: Any,
        start: int,
    ) -> None:
        self._spec, self._data, self._channel = spec, data, channel
        self._checkpoints, self._model = checkpoints, model
        self.completed = start
        self.stopped = StopReason.NONE
        self.metrics: dict[str, float] = {}
        self._interrupted = False
        self._epoch_began = self._last_step = 0.0
        self._next_check = 0.0

    def callback(self) -> Any:
        return _keras().callbacks.LambdaCallback(
            on_epoch_begin=self._on_epoch_begin,
            on_train_batch_end=self._on_batch_end,
            on_epoch_end=self._on_epoch_end,
        )

    def _on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        rate = learning_rate(self._spec.hparams.learning_rate, epoch + 1, self._spec.epochs)
        self._model.optimizer.learning_rate.assign(rate)
        self._epoch_began = self._last_step = time.perf_counter()

    def _on_batch_end(self, batch: int, logs: Any = None) -> None:
        # Keras has synchronised on the step's logs: this is when the step ended.
        self._last_step = now = time.perf_counter()
        if now < self._next_check:
            return
        self._next_check = now + STOP_CHECK_INTERVAL_S
        reason = self._channel.stop_requested()
        if reason is not StopReason.NONE:
            self.stopped, self._interrupted = reason, True
            self._model.stop_training = True

    def _on_epoch_end(self, epoch: int, logs: Mapping[str, float] | None = None) -> None:
        if self._interrupted:
            return
        step = epoch + 1
        seconds = max(self._last_step - self._epoch_began, 1e-9)
        logs = logs or {}
        val = _evaluate_local(self._model, self._data, "val", self._spec.hparams.batch_size)
        metrics = _epoch_metrics(self._data.task, logs["loss"], val)
        metrics["samples_per_s"] = len(self._data.x_train) / seconds
        self._checkpoints.save(step)
        self.completed, self.metrics = step, metrics
        self._channel.epoch(step, metrics)
        log.info("tf.epoch", trial_id=self._spec.trial_id, step=step, **metrics)
        if step < self._spec.epochs:
            reason = self._channel.stop_requested()
            if reason is not StopReason.NONE:
                self.stopped = reason
                self._model.stop_training = True


def _replica_updated_state(strategy: Any) -> contextlib.AbstractContextManager[Any]:
    """Under CentralStorageStrategy every variable is one copy that replicas
    update through an aggregation, and Keras' random-seed state (Dropout's)
    has none ("You must specify an aggregation method to update a
    AggregatingVariable in Replica Context"): such state takes the first
    replica's update. Other strategies create their variables unchanged."""
    tf = _tf()
    if not isinstance(strategy, tf.distribute.experimental.CentralStorageStrategy):
        return contextlib.nullcontext()
    none = tf.VariableAggregation.NONE

    def creator(next_creator: Callable[..., Any], **kwargs: Any) -> Any:
        if kwargs.get("aggregation") in (None, none) and not kwargs.get("trainable", True):
            kwargs["aggregation"] = tf.VariableAggregation.ONLY_FIRST_REPLICA
        return next_creator(**kwargs)

    return cast(contextlib.AbstractContextManager[Any], tf.variable_creator_scope(creator))


def _train_fit(
    spec: RunSpec, data: DataSplits, channel: Channel, strategy: Any
) -> tuple[RunResult, Any]:
    hp = spec.hparams
    with strategy.scope(), _replica_updated_state(strategy):
        model = tf_models.build_model(spec.model_family, hp, data)
        tf_models.compile_model(model, hp, data.task)
        # Built now, so that a checkpoint restores the optimizer's slots too.
        model.optimizer.build(model.trainable_variables)
    checkpoints = _Checkpoints(Path(spec.checkpoint_dir), model, model.optimizer)
    start, note = checkpoints.restore()
    channel.started(start, note)
    log.info("tf.started", trial_id=spec.trial_id, resumed_from_step=start, note=note)
    loop = _EpochLoop(spec, data, channel, checkpoints, model, start)
    # Validation and test are scored in NumPy batches (``_evaluate_local``),
    # not by Keras' evaluate: dropping a spent tf.data iterator in Keras'
    # per-epoch evaluation reset segfaulted, now and then, a process that
    # had run many trials (TensorFlow 2.21, Keras 3.15).
    if start < spec.epochs:
        model.fit(
            data.x_train,
            _targets(data, data.y_train),
            batch_size=hp.batch_size,
            epochs=spec.epochs,
            initial_epoch=start,
            callbacks=[loop.callback()],
            shuffle=True,
            verbose=0,
        )
    if loop.stopped is not StopReason.NONE:
        log.info("tf.stopped", trial_id=spec.trial_id, reason=loop.stopped.name, at=loop.completed)
        return RunResult(loop.completed, loop.stopped, loop.metrics), model
    val_metrics = loop.metrics
    if not val_metrics:
        # Every epoch was done by an earlier attempt: measure what it left.
        train_eval = _evaluate_local(model, data, "train", hp.batch_size)
        val_eval = _evaluate_local(model, data, "val", hp.batch_size)
        val_metrics = _epoch_metrics(data.task, train_eval["loss"], val_eval)
    test_eval = _evaluate_local(model, data, "test", hp.batch_size)
    result = RunResult(
        epochs_completed=max(start, loop.completed),
        val_metrics=val_metrics,
        test_metrics=_test_metrics(data.task, test_eval),
    )
    return result, model


# -- multi_worker_mirrored and parameter_server: custom loops ------------------------------


@dataclass(frozen=True)
class _Steps:
    """How a custom loop runs training steps on its strategy."""

    # Launch one step; returns a handle on its loss.
    launch: Callable[[], Any]
    # The step's loss from its handle (waits for the step).
    loss: Callable[[Any], float]
    # Wait for every launched step.
    join: Callable[[], None]
    # Launch at most this many steps ahead of the finished ones (0: no limit).
    in_flight: int
    # May a stop interrupt an epoch? Only where one process launches every step.
    between_batches: bool
    # Every task's stop decision from the chief's (the identity with one process).
    agree: Callable[[StopReason], StopReason]
    # Samples per step, over all replicas.
    global_batch: int


def _train_custom(
    spec: RunSpec,
    data: DataSplits,
    channel: Channel,
    strategy: Any,
    name: str,
    role: Role,
    scratch: Path | None,
) -> tuple[RunResult, Any]:
    """MultiWorkerMirrored (Keras 3's ``fit`` cannot drive it: its symbolic
    build reduces the input batch across workers and fails) and
    ParameterServer (no ``fit`` support in Keras 3): one loop, ``steps =
    ceil(N / batch)`` steps an epoch over a repeated, shuffled dataset.

    Multi-worker: every worker runs every step (an all-reduce of gradients),
    every worker checkpoints (a save may read sync-on-read variables), the
    chief's restored state and its stop decision reach the others through
    all-reduces, so all of them leave after the same epoch. Parameter server:
    the coordinator schedules the steps on whichever worker is free, at most
    a few in flight, so a stop lands within a few steps; the parameter
    servers hold the variables. Validation and test run in the chief's
    process, which holds (or reads) the current weights."""
    tf, keras = _tf(), _keras()
    hp = spec.hparams
    chief = role.is_chief
    coordinator = (
        tf.distribute.coordinator.ClusterCoordinator(strategy) if name == PARAMETER_SERVER else None
    )
    with strategy.scope():
        model = tf_models.build_model(spec.model_family, hp, data)
        optimizer = tf_models.make_optimizer(hp)
        if keras.mixed_precision.global_policy().name == "mixed_float16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        optimizer.build(model.trainable_variables)
    classify = data.task == TASK_CLASSIFICATION
    loss_fn: Callable[[Any, Any], Any] = (
        keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
        if classify
        else keras.losses.MeanSquaredError(reduction=None)
    )
    x_train, y_train = data.x_train, _targets(data, data.y_train)
    # MultiWorker: the batch is split over the replicas; ParameterServer: one per step.
    replicas = int(strategy.num_replicas_in_sync) if coordinator is None else 1
    per_replica = max(1, hp.batch_size // replicas)
    global_batch = per_replica * replicas
    seed = spec.seed

    def dataset_fn(context: Any = None) -> Any:
        dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train))
        if context is not None:
            # Multi-worker: every worker shuffles its shard in the same seeded order.
            dataset = dataset.shard(context.num_input_pipelines, context.input_pipeline_id)
            dataset = dataset.shuffle(len(x_train), seed=seed, reshuffle_each_iteration=True)
        else:
            # Parameter server: the one traced function runs on every worker, and only an
            # unseeded shuffle (no global seed either) gives each worker its own order.
            dataset = dataset.shuffle(len(x_train), reshuffle_each_iteration=True)
        return dataset.repeat().batch(per_replica, drop_remainder=True).prefetch(2)

    def replica_step(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            per_example = loss_fn(y, model(x, training=True))
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
            scaled = optimizer.scale_loss(loss)
        grads = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    def step_fn(iterator: Any) -> Any:
        x, y = next(iterator)
        return strategy.reduce(
            tf.distribute.ReduceOp.SUM, strategy.run(replica_step, args=(x, y)), axis=None
        )

    train_step = tf.function(step_fn)
    if coordinator is not None:
        tf.random.set_seed(None)
        try:
            iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
        finally:
            tf.random.set_seed(seed)
        workers = len(role.cluster.get("worker", ()))
        steps = _Steps(
            launch=lambda: coordinator.schedule(train_step, args=(iterator,)),
            loss=lambda handle: float(handle.fetch()),
            join=coordinator.join,
            in_flight=4 * max(1, workers),
            between_batches=True,
            agree=lambda reason: reason,
            global_batch=global_batch,
        )
    else:
        iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))
        broadcast = _chief_broadcast(strategy)

        def agree(reason: StopReason) -> StopReason:
            agreed = broadcast([tf.constant(float(reason), tf.float32)])
            return StopReason(round(float(agreed[0].numpy())))

        steps = _Steps(
            launch=lambda: train_step(iterator),
            loss=lambda handle: float(handle.numpy()),
            join=lambda: None,
            in_flight=0,
            between_batches=False,
            agree=agree,
            global_batch=global_batch,
        )
    # Non-chief workers write throw-away checkpoints: the chief's are the trial's.
    if chief:
        directory = Path(spec.checkpoint_dir)
    else:
        directory = scratch or Path(tempfile.mkdtemp(prefix="tf-worker-ckpt-"))
    try:
        checkpoints = _Checkpoints(directory, model, optimizer)
        start, note = checkpoints.restore() if chief else (0, "")
        if coordinator is None:
            variables = [*model.variables, *optimizer.variables]
            values = _chief_broadcast(strategy)(
                [tf.constant(start, tf.int64), *[v.value for v in variables]]
            )
            start = int(values[0].numpy())
            for variable, value in zip(variables, values[1:], strict=True):
                variable.assign(value)
        if chief:
            channel.started(start, note)
            log.info("tf.started", trial_id=spec.trial_id, resumed_from_step=start, note=note)
        completed, metrics, stopped = _custom_epochs(
            spec, data, channel, model, optimizer, checkpoints, steps, start=start, chief=chief
        )
    finally:
        if not chief:
            shutil.rmtree(directory, ignore_errors=True)
    # ParameterServer: the variables live on servers that go when ``train`` returns.
    trained = _local_copy(model, spec, data) if coordinator is not None else model
    if stopped is not StopReason.NONE:
        log.info("tf.stopped", trial_id=spec.trial_id, reason=stopped.name, at=completed)
        return RunResult(completed, stopped, metrics), trained
    if not chief:
        return RunResult(completed, StopReason.NONE, metrics), trained
    if not metrics:
        # Every epoch was done by an earlier attempt: measure what it left.
        train_loss = _evaluate_local(trained, data, "train", hp.batch_size)["loss"]
        val = _evaluate_local(trained, data, "val", hp.batch_size)
        metrics = _epoch_metrics(data.task, train_loss, val)
    test = _test_metrics(data.task, _evaluate_local(trained, data, "test", hp.batch_size))
    return RunResult(max(start, completed), StopReason.NONE, metrics, test), trained


def _custom_epochs(
    spec: RunSpec,
    data: DataSplits,
    channel: Channel,
    model: Any,
    optimizer: Any,
    checkpoints: _Checkpoints,
    steps: _Steps,
    *,
    start: int,
    chief: bool,
) -> tuple[int, dict[str, float], StopReason]:
    """Epochs start+1..spec.epochs; (the last completed, its metrics, why it stopped)."""
    per_epoch = max(1, math.ceil(len(data.x_train) / steps.global_batch))
    completed = start
    metrics: dict[str, float] = {}
    next_check = 0.0
    for step in range(start + 1, spec.epochs + 1):
        optimizer.learning_rate.assign(learning_rate(spec.hparams.learning_rate, step, spec.epochs))
        began = time.perf_counter()
        handles: list[Any] = []
        stopped = StopReason.NONE
        for i in range(per_epoch):
            if steps.in_flight and i >= steps.in_flight:
                steps.loss(handles[i - steps.in_flight])
            if steps.between_batches and (now := time.perf_counter()) >= next_check:
                next_check = now + STOP_CHECK_INTERVAL_S
                stopped = channel.stop_requested()
                if stopped is not StopReason.NONE:
                    break
            handles.append(steps.launch())
        steps.join()
        if stopped is not StopReason.NONE:
            return completed, metrics, stopped
        losses = [steps.loss(h) for h in handles]
        seconds = max(time.perf_counter() - began, 1e-9)
        metrics = {}
        if chief:
            val = _evaluate_local(model, data, "val", spec.hparams.batch_size)
            metrics = _epoch_metrics(data.task, float(np.mean(losses)), val)
            metrics["samples_per_s"] = per_epoch * steps.global_batch / seconds
        checkpoints.save(step)
        completed = step
        if chief:
            channel.epoch(step, metrics)
            log.info("tf.epoch", trial_id=spec.trial_id, step=step, **metrics)
        if step < spec.epochs:
            stopped = steps.agree(channel.stop_requested())
            if stopped is not StopReason.NONE:
                return completed, metrics, stopped
    return completed, metrics, StopReason.NONE


def _local_copy(model: Any, spec: RunSpec, data: DataSplits) -> Any:
    """The same network with this process's own variables holding ``model``'s
    weights (built outside any strategy scope)."""
    copy = tf_models.build_model(spec.model_family, spec.hparams, data)
    copy.set_weights(model.get_weights())
    return copy


def _evaluate_local(model: Any, data: DataSplits, split: str, batch: int) -> dict[str, float]:
    """Loss and accuracy (or MSE and MAE) of ``split``, computed in this
    process: the mean cross-entropy from logits (or squared error) and the
    fraction of argmax hits (or the mean absolute error)."""
    x = getattr(data, f"x_{split}")
    y = _targets(data, getattr(data, f"y_{split}"))
    classify = data.task == TASK_CLASSIFICATION
    loss_sum = score_sum = 0.0
    size = max(batch, 1024)
    for begin in range(0, len(x), size):
        out = np.asarray(model(x[begin : begin + size], training=False), dtype=np.float64)
        target = y[begin : begin + size]
        if classify:
            shifted = out - out.max(axis=-1, keepdims=True)
            log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
            loss_sum -= float(np.take_along_axis(log_probs, target[:, None], axis=-1).sum())
            score_sum += float(np.sum(np.argmax(out, axis=-1) == target))
        else:
            loss_sum += float(np.sum((out - target) ** 2))
            score_sum += float(np.sum(np.abs(out - target)))
    n = max(len(x), 1)
    return {"loss": loss_sum / n, ("accuracy" if classify else "mae"): score_sum / n}


class TensorFlowRunner:
    """``plan.Runner`` for TensorFlow."""

    name = "tensorflow"

    def warm_up(self, threads: int) -> None:
        tf, keras = _tf(), _keras()
        if threads > 0:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
        # Start the runtime and trace one tiny fit: what every first trial of
        # a process would otherwise pay.
        tiny = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        tiny.compile(optimizer="adam", loss="mse")
        tiny.fit(np.zeros((8, 4), np.float32), np.zeros((8, 2), np.float32), verbose=0)
        self.release()

    def fresh_process(self, spec: RunSpec) -> bool:
        """MultiWorkerMirrored and the parameter-server coordinator configure
        the runtime's collectives and cluster, which must happen before the
        runtime starts; so do logical CPU devices (``mirrored`` and
        ``central_storage`` without GPUs) and hiding the GPUs (``device:
        cpu`` on a GPU host)."""
        try:
            strategy = strategy_of(spec)
        except TrialError:
            return False  # the run refuses it with its reason
        gpus = bool(_tf().config.list_physical_devices("GPU"))
        return (
            strategy in (MULTI_WORKER, PARAMETER_SERVER)
            or (strategy in (MIRRORED, CENTRAL_STORAGE) and not gpus)
            or (spec.device == "cpu" and gpus)
        )

    def run(self, spec: RunSpec, data: DataSplits, channel: Channel) -> RunResult:
        return run(spec, data, channel)

    def release(self) -> None:
        # Keras keeps every model and graph of the process until told;
        # TensorFlow keeps its GPU memory pool (it is reused, not returned).
        _keras().backend.clear_session()
        gc.collect()


RUNNER = TensorFlowRunner()
