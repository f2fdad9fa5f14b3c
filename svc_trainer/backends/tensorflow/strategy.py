"""Which TensorFlow strategy a trial asked for, whether it can run here, and
this process's place in its cluster.

Everything here is checked before any training starts (``check``), so a
configuration that cannot train fails with its ``TrialError`` reason, not
half-way. The cluster of a multi-process strategy is either the one
``spec.tf_config`` names (``given_role``) or a new one on localhost whose
chief is this process (``local_role``).
"""

from __future__ import annotations

from svc_trainer.backends.tensorflow import cluster as tf_cluster
from svc_trainer.backends.tensorflow import models as tf_models
from svc_trainer.backends.tensorflow.cluster import Role
from svc_trainer.backends.tensorflow.epochs import metric_names
from svc_trainer.plan import DataSplits, RunSpec, TrialError, check_replicas_fit

ONE_DEVICE = "one_device"
MIRRORED = "mirrored"
CENTRAL_STORAGE = "central_storage"
MULTI_WORKER = "multi_worker_mirrored"
PARAMETER_SERVER = "parameter_server"
STRATEGIES = (ONE_DEVICE, MIRRORED, CENTRAL_STORAGE, MULTI_WORKER, PARAMETER_SERVER)
# One process, Keras fit, replicas on this node's devices.
LOCAL_STRATEGIES = (ONE_DEVICE, MIRRORED, CENTRAL_STORAGE)
_ALIASES = {"": ONE_DEVICE, "single": ONE_DEVICE}


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
    if not (spec.model or spec.entrypoint):
        tf_models.check_fits(spec.model_family, data)
    names = metric_names(data.task)
    # A loop of the user's reports metrics of its own choosing.
    if not spec.entrypoint and spec.objective_metric not in names:
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
    if spec.device == "cuda" and not _host_gpus():
        raise TrialError("device=cuda but this host has no GPU", reason="invalid_params")
    if strategy == PARAMETER_SERVER:
        ps_count(spec)
    if strategy == MULTI_WORKER and spec.tf_config:
        raise TrialError(
            "multi_worker_mirrored across hosts runs as Spark barrier tasks "
            "(task.options.launcher: spark): a trainer replica takes whole trials, so no "
            "other host's replica would run the other workers; AISTACK_TRAINER_TF_CONFIG "
            "names parameter_server clusters only",
            reason="invalid_params",
        )
    if strategy == MULTI_WORKER:
        check_replicas_fit(strategy, local_workers(spec), local_gpus(spec))
    elif strategy in (MIRRORED, CENTRAL_STORAGE):
        check_replicas_fit(strategy, spec.world_size, local_gpus(spec))
    given_role(spec, strategy)
    return strategy


def local_gpus(spec: RunSpec) -> int:
    """The GPUs a trial on this host trains on (none with ``device: cpu``)."""
    return 0 if spec.device == "cpu" else _host_gpus()


def local_workers(spec: RunSpec) -> int:
    """A local MultiWorkerMirrored cluster's size: ``world_size``, else one
    worker per GPU, else 2."""
    return spec.world_size if spec.world_size > 0 else (local_gpus(spec) or 2)


def _host_gpus() -> int:
    import tensorflow as tf

    return len(tf.config.list_physical_devices("GPU"))


def ps_count(spec: RunSpec) -> int:
    text = spec.options.get("ps", "1")
    if not text.isdigit() or int(text) < 1:
        raise TrialError(f"options ps={text!r}: expected an integer >= 1", reason="invalid_params")
    return int(text)


def given_role(spec: RunSpec, strategy: str) -> Role | None:
    """This process's task in the cluster ``spec.tf_config`` names, if any."""
    if strategy in LOCAL_STRATEGIES or not spec.tf_config:
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


def local_role(spec: RunSpec, strategy: str) -> Role:
    """No cluster for a single-process strategy; else the chief of a new
    localhost cluster (fresh ports on every call)."""
    if strategy in LOCAL_STRATEGIES:
        return Role()
    if strategy == MULTI_WORKER:
        return tf_cluster.local_multi_worker(local_workers(spec))
    return tf_cluster.local_parameter_server(
        spec.world_size if spec.world_size > 0 else 1, ps_count(spec)
    )
