"""Every service's way to a URL's filesystem: a local path, any fsspec URL
(``ftp://…``, ``memory://…``), or a bucket on the S3-compatible object store
that ``ObjectStoreSettings`` describes: ``s3://bucket/key`` through fsspec's
s3fs, ``s3a://bucket/key`` (Hadoop's name for the same object, which Spark
writes) the same way.

A store that is away (refused, reset, timed out) is ridden out for
``ride_out_s`` (``ride_out``), then fails with ``Unavailable`` (retryable),
naming the store; any other error is the caller's to see.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from shared.errors import FailedPrecondition, Unavailable
from shared.log import get_logger
from shared.settings import ObjectStoreSettings

log = get_logger("object_store")

#: The URL schemes that name an object on the store: fsspec's and Hadoop's.
SCHEMES = ("s3", "s3a")
#: Between tries at a store that is away.
_RETRY_PAUSE_S = 0.5

T = TypeVar("T")


def scheme(url: str) -> str:
    """``url``'s scheme, "" for a plain path."""
    name, separator, _ = url.partition("://")
    return name.lower() if separator else ""


def is_object_url(url: str) -> bool:
    return scheme(url) in SCHEMES


def fsspec_url(url: str) -> str:
    """``url`` as fsspec names it: ``s3a://`` becomes ``s3://``."""
    return f"s3://{url.partition('://')[2]}" if scheme(url) == "s3a" else url


def hadoop_url(url: str) -> str:
    """``url`` as Hadoop names it: ``s3://`` becomes ``s3a://``, Hadoop's
    maintained S3 connector."""
    return f"s3a://{url.partition('://')[2]}" if scheme(url) == "s3" else url


def s3fs_options(settings: ObjectStoreSettings) -> dict[str, Any]:
    """``s3fs.S3FileSystem``'s keyword arguments for the store."""
    config: dict[str, Any] = {
        # botocore's own retries would hide an outage behind minutes of
        # waiting; ``ride_out`` retries with the store named instead.
        "retries": {"max_attempts": 2, "mode": "standard"},
        "connect_timeout": 5,
        "read_timeout": 60,
    }
    if settings.path_style:
        config["s3"] = {"addressing_style": "path"}
    options: dict[str, Any] = {
        "client_kwargs": {"region_name": settings.region},
        "config_kwargs": config,
    }
    if settings.endpoint:
        options["endpoint_url"] = settings.endpoint
    if settings.access_key_id and settings.secret_access_key is not None:
        options["key"] = settings.access_key_id
        options["secret"] = settings.secret_access_key.get_secret_value()
    return options


def settings_env(settings: ObjectStoreSettings) -> dict[str, str]:
    """``settings`` as the environment of a process that reads them
    (``AISTACK_OBJECT_STORE_*``): how a service hands them to a child."""
    env = {
        "AISTACK_OBJECT_STORE_ENDPOINT": settings.endpoint,
        "AISTACK_OBJECT_STORE_REGION": settings.region,
        "AISTACK_OBJECT_STORE_PATH_STYLE": str(settings.path_style).lower(),
        "AISTACK_OBJECT_STORE_RIDE_OUT_S": str(settings.ride_out_s),
    }
    if settings.access_key_id and settings.secret_access_key is not None:
        env["AISTACK_OBJECT_STORE_ACCESS_KEY_ID"] = settings.access_key_id
        secret = settings.secret_access_key.get_secret_value()
        env["AISTACK_OBJECT_STORE_SECRET_ACCESS_KEY"] = secret
    return env


def boto3_env(settings: ObjectStoreSettings) -> dict[str, str]:
    """The store as the environment of a process whose S3 client is plain
    boto3 configured by variables (TensorBoard reading ``s3://`` runs)."""
    env = {"AWS_REGION": settings.region, "AWS_DEFAULT_REGION": settings.region}
    if settings.endpoint:
        env["S3_ENDPOINT"] = settings.endpoint
    if settings.access_key_id and settings.secret_access_key is not None:
        env["AWS_ACCESS_KEY_ID"] = settings.access_key_id
        env["AWS_SECRET_ACCESS_KEY"] = settings.secret_access_key.get_secret_value()
    return env


def s3_filesystem(settings: ObjectStoreSettings) -> Any:
    """A new s3fs filesystem on the store: not fsspec's cached instance,
    whose event loop and connections a forked process must not share."""
    try:
        import s3fs
    except ImportError as exc:
        raise FailedPrecondition(
            "s3:// needs s3fs: install aistack's trainer or model extra"
        ) from exc
    return s3fs.S3FileSystem(skip_instance_cache=True, **s3fs_options(settings))


def filesystem(url: str, settings: ObjectStoreSettings | None = None) -> tuple[Any, str]:
    """(fsspec filesystem, path on it) of ``url``: the object store for
    ``s3://`` and ``s3a://`` (``settings``; None: the environment's, for a
    command or a child process such as a trial), fsspec's for any other URL,
    the local filesystem for a plain path. FailedPrecondition when no fsspec
    backend knows the scheme."""
    import fsspec

    if is_object_url(url):
        store = settings or ObjectStoreSettings()
        return s3_filesystem(store), url.partition("://")[2].rstrip("/")
    try:
        fs, path = fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as exc:
        raise FailedPrecondition(
            f"{url!r}: no fsspec backend for {scheme(url) or 'a local path'}:// ({exc})"
        ) from exc
    return fs, str(path)


def arrow_filesystem(fs: Any) -> Any:
    """An fsspec filesystem as pyarrow's, whose listings leave out S3A's
    directory markers.

    Spark's S3A client keeps an empty object named ``dir/`` for a directory
    it made (Hadoop 3.4 keeps markers by default). s3fs lists one as a file
    whose path ends in ``/``, and pyarrow's dataset discovery then fails to
    open it (FileNotFoundError), so a store Spark wrote (the offline store,
    a job's output) could not be read back at times. The directory itself
    is still listed: its files are below it."""
    from pyarrow.fs import FileSelector, FileType, FSSpecHandler, PyFileSystem

    class _Handler(FSSpecHandler):  # type: ignore[misc]
        def get_file_info_selector(self, selector: FileSelector) -> list[Any]:
            return [
                info
                for info in super().get_file_info_selector(selector)
                if not (info.type == FileType.File and info.path.endswith("/"))
            ]

    return PyFileSystem(_Handler(fs))


def where(url: str, settings: ObjectStoreSettings) -> str:
    """The store a URL is on, for messages: the endpoint, never credentials."""
    if is_object_url(url):
        return f"object store {settings.endpoint or 'AWS S3 (' + settings.region + ')'}"
    return f"{scheme(url) or 'local'} filesystem"


def is_outage(error: BaseException) -> bool:
    """Whether ``error`` says the store could not be reached (so a retry may
    succeed), as opposed to what it answered."""
    try:
        from botocore import exceptions as boto

        if isinstance(error, (boto.ConnectionError, boto.HTTPClientError)):
            return True
    except ImportError:  # no s3fs: not an object store's error
        pass
    # aiohttp's and the socket's own, where s3fs lets them through.
    return isinstance(error, (ConnectionError, TimeoutError)) or type(error).__name__ in (
        "ClientConnectorError",
        "ServerDisconnectedError",
        "ClientOSError",
    )


def ride_out(call: Callable[[], T], *, seconds: float, what: str) -> T:
    """``call()``, tried again while the store is away, for up to
    ``seconds``; then ``Unavailable`` naming ``what``. Only for calls that
    are safe to repeat (a whole object written again, a read)."""
    deadline = time.monotonic() + seconds
    tries = 0
    while True:
        tries += 1
        try:
            return call()
        except Exception as error:
            if not is_outage(error):
                raise
            if time.monotonic() >= deadline:
                raise Unavailable(
                    f"{what}: unreachable for {seconds:g} s ({type(error).__name__}: {error}); "
                    "try again when it is back"
                ) from error
            if tries == 1:
                log.warning("object_store.away", what=what, error=str(error))
            time.sleep(_RETRY_PAUSE_S)


def move_tree(fs: Any, source: str, target: str) -> int:
    """Every object under ``source`` to the same name under ``target`` on
    the store ``fs``, copied (server-side) then removed: an object store has
    no rename. The directory markers some writers leave (S3A's ``dir/``,
    empty objects named with a trailing slash) are removed, not copied:
    s3fs names them without it, a key no object has. Returns how many moved."""
    fs.invalidate_cache()
    prefix = source.rstrip("/") + "/"
    found = [path for path in fs.find(source) if path.startswith(prefix)]
    objects = [path for path in found if not path.endswith("/")]
    for path in objects:
        fs.copy(path, f"{target.rstrip('/')}/{path[len(prefix) :]}")
    if objects:
        fs.rm(objects)
    for marker in (path for path in found if path.endswith("/")):
        bucket, _, key = marker.partition("/")
        fs.call_s3("delete_object", Bucket=bucket, Key=key)
    fs.invalidate_cache()
    return len(objects)


def create_bucket(settings: ObjectStoreSettings, bucket: str) -> None:
    """Create ``bucket`` unless the store has it already. Asked outright: a
    store may answer a bucket's existence loosely (S3Proxy's HEAD does)."""
    fs = s3_filesystem(settings)
    location = (
        {}
        if settings.region == "us-east-1"
        else {"CreateBucketConfiguration": {"LocationConstraint": settings.region}}
    )
    try:
        fs.call_s3("create_bucket", Bucket=bucket, **location)
    except Exception as error:
        if "BucketAlready" not in str(error) and not isinstance(error, FileExistsError):
            raise


#: Spark's commit protocol that hands a write to the committer Hadoop's
#: factory names for the destination's scheme (``spark-hadoop-cloud``).
PATH_OUTPUT_COMMIT_PROTOCOL = "org.apache.spark.internal.io.cloud.PathOutputCommitProtocol"
#: Parquet's committer bound to that same factory.
BINDING_PARQUET_COMMITTER = "org.apache.spark.internal.io.cloud.BindingParquetOutputCommitter"
#: Streaming checkpoints written straight to their name, aborted on failure:
#: no rename (a copy on S3). It refuses a filesystem without abortable
#: streams (a local one), so it is for a checkpoint on the store only.
ABORTABLE_CHECKPOINT_MANAGER = (
    "org.apache.spark.internal.io.cloud.AbortableStreamBasedCheckpointFileManager"
)
#: A checkpoint on this machine's disk written through Hadoop's FileSystem:
#: a temporary file renamed into place (atomic there). Spark's default goes
#: through a FileContext, whose rename asks the link status of both names,
#: and Hadoop without its native library runs readlink for each: two
#: processes per checkpoint file, two thirds of all svc_transform's JVM
#: started at 1,000 events/s.
LOCAL_CHECKPOINT_MANAGER = (
    "org.apache.spark.sql.execution.streaming.FileSystemBasedCheckpointFileManager"
)
CHECKPOINT_MANAGER_CONF = "spark.sql.streaming.checkpointFileManagerClass"
#: S3A's committer: the magic one writes each task's files as uncompleted
#: multipart uploads and completes them at job commit, with no rename and
#: nothing but the store itself (the staging committers also need a
#: filesystem every worker shares, which a cluster without HDFS lacks).
S3A_COMMITTER = "magic"
#: Between S3A's retries of a store that is away; each retry waits twice as
#: long as the one before.
_S3A_RETRY_INTERVAL_S = 0.5


def s3a_retry_limit(ride_out_s: float) -> int:
    """S3A's retries of an unreachable store such that its exponential
    back-off (``_S3A_RETRY_INTERVAL_S``, doubling) waits about
    ``ride_out_s`` in all, then fails."""
    # floor(log2(n)) of the whole tries' worth of waiting.
    return int(ride_out_s / _S3A_RETRY_INTERVAL_S + 1).bit_length() - 1


def hadoop_options(settings: ObjectStoreSettings) -> dict[str, str]:
    """Spark settings for ``s3a://`` on the store (``spark.hadoop.fs.s3a.*``)
    and for safe writes there: Parquet through S3A's magic committer (its
    files appear at job commit, none renamed). Other schemes are unchanged:
    a local path still commits through Hadoop's FileOutputCommitter. A
    checkpoint on the store also needs ``checkpoint_options``.

    An outage fails a read or write after about ``ride_out_s`` of retries
    (``s3a_retry_limit``), as ``ride_out`` does, instead of S3A's minutes."""
    s3a = {
        "endpoint.region": settings.region,
        "path.style.access": str(settings.path_style).lower(),
        "connection.ssl.enabled": str(not settings.endpoint.startswith("http://")).lower(),
        # The SDK's own retries, each behind S3A's: one more try, as s3fs's.
        "attempts.maximum": "2",
        "retry.limit": str(s3a_retry_limit(settings.ride_out_s)),
        "retry.interval": f"{int(_S3A_RETRY_INTERVAL_S * 1000)}ms",
        # S3A raises less than 15 s to 15 s, with a warning.
        "connection.establish.timeout": "15000",
        "connection.timeout": "60000",
        "committer.name": S3A_COMMITTER,
        "committer.magic.enabled": "true",
        # A task's uploads listed in its own memory, not as a .pending
        # object each (HADOOP-17833): Spark commits a task in the process
        # that wrote it. bench.object_store: the offline store's write on
        # the bucket 14.2 s without, 9.0 s with (6.4 s on disk).
        "committer.magic.track.commits.in.memory.enabled": "true",
    }
    if settings.endpoint:
        s3a["endpoint"] = settings.endpoint
    if settings.access_key_id and settings.secret_access_key is not None:
        s3a["aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
        s3a["access.key"] = settings.access_key_id
        s3a["secret.key"] = settings.secret_access_key.get_secret_value()
    else:
        # The SDK's chain, as s3fs's (botocore's): AWS_* variables, ~/.aws,
        # a web-identity token (STS), a container's or an instance's role.
        s3a["aws.credentials.provider"] = (
            "software.amazon.awssdk.auth.credentials.DefaultCredentialsProvider"
        )
    return {
        **{f"spark.hadoop.fs.s3a.{key}": value for key, value in s3a.items()},
        "spark.hadoop.mapreduce.outputcommitter.factory.scheme.s3a": (
            "org.apache.hadoop.fs.s3a.commit.S3ACommitterFactory"
        ),
        "spark.sql.sources.commitProtocolClass": PATH_OUTPUT_COMMIT_PROTOCOL,
        "spark.sql.parquet.output.committer.class": BINDING_PARQUET_COMMITTER,
    }


def checkpoint_options(url: str) -> dict[str, str]:
    """Spark settings for a streaming checkpoint at ``url``: on the store,
    written without rename (``ABORTABLE_CHECKPOINT_MANAGER``); on this
    machine's disk (a path, ``file:``), through Hadoop's FileSystem
    (``LOCAL_CHECKPOINT_MANAGER``); elsewhere (HDFS) Spark's default."""
    if is_object_url(url):
        return {CHECKPOINT_MANAGER_CONF: ABORTABLE_CHECKPOINT_MANAGER}
    if scheme(url) in ("", "file"):
        return {CHECKPOINT_MANAGER_CONF: LOCAL_CHECKPOINT_MANAGER}
    return {}
