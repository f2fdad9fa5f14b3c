"""The devices a TensorFlow trial computes on, and the ``tf.distribute``
strategy over them.

``configure`` sets what is process-wide (visible GPUs, threads, logical CPU
devices, the precision policy, seeds) and must run before the runtime
starts; ``distribution`` then builds the strategy object ``strategy``
named, on those devices and this process's cluster ``Role``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shared.log import get_logger
from svc_trainer.backends.tensorflow.cluster import Role
from svc_trainer.backends.tensorflow.strategy import (
    CENTRAL_STORAGE,
    MIRRORED,
    MULTI_WORKER,
    ONE_DEVICE,
)
from svc_trainer.plan import RunSpec

log = get_logger("svc_trainer")


@dataclass(frozen=True)
class Devices:
    """What ``configure`` left this process to compute on."""

    gpus: int
    mixed_precision: bool


def configure(spec: RunSpec, strategy: str, role: Role) -> Devices:
    """Process-wide TensorFlow settings, before the runtime starts. In a
    process where it already started (tests) what cannot change stays."""
    import keras
    import tensorflow as tf

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
    return Devices(len(gpus), mixed)


def distribution(spec: RunSpec, name: str, role: Role, devices: Devices) -> Any:
    """The ``tf.distribute`` strategy ``name`` over ``devices`` (and, for a
    multi-process strategy, over ``role``'s cluster)."""
    import tensorflow as tf

    if name == ONE_DEVICE:
        return tf.distribute.OneDeviceStrategy("/gpu:0" if devices.gpus else "/cpu:0")
    if name in (MIRRORED, CENTRAL_STORAGE):
        replicas = replica_devices(spec, name, devices)
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
        _coordinate(resolver.cluster_spec())
        implementation = tf.distribute.experimental.CommunicationImplementation
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=implementation.NCCL if devices.gpus else implementation.RING
        )
        return tf.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=resolver, communication_options=options
        )
    return tf.distribute.experimental.ParameterServerStrategy(resolver)


# TensorFlow's default is 10 s without a heartbeat before the coordination
# service fails the whole cluster. On a loaded two-core host (CI runs two test
# workers beside Spark and Kafka) the chief's own heartbeat has gone 10.6 s
# unsent while its peer was still importing TensorFlow, failing a healthy run.
# A dead peer is still seen at once: its ring connection breaks.
HEARTBEAT_TIMEOUT_MS = 60_000


def _coordinate(cluster: Any) -> None:
    """The coordination service MultiWorkerMirroredStrategy would configure
    itself (the same leader and jobs), with ``HEARTBEAT_TIMEOUT_MS``."""
    from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
    from tensorflow.python.distribute import multi_worker_util
    from tensorflow.python.eager import context

    if context.context().coordination_service is not None:
        return
    jobs = [
        coordination_config_pb2.CoordinatedJob(name=job, num_tasks=cluster.num_tasks(job))
        for job in ("chief", "worker")
        if job in cluster.jobs
    ]
    context.context().configure_coordination_service(
        service_type="standalone",
        service_leader=multi_worker_util.coordination_leader(cluster),
        heartbeat_timeout_in_ms=HEARTBEAT_TIMEOUT_MS,
        coordinated_jobs=jobs,
    )


def replica_devices(spec: RunSpec, name: str, devices: Devices) -> list[str]:
    """The devices a one-process multi-replica strategy computes on: every
    local GPU (``world_size`` of them when set), else ``world_size`` (2)
    logical CPU devices."""
    import tensorflow as tf

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
