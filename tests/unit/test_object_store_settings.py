"""Spark's settings for the object store (``shared.object_store.hadoop_options``)."""

from __future__ import annotations

from pydantic import SecretStr

from shared.object_store import (
    ABORTABLE_CHECKPOINT_MANAGER,
    CHECKPOINT_MANAGER_CONF,
    LOCAL_CHECKPOINT_MANAGER,
    checkpoint_options,
    hadoop_options,
    s3a_retry_limit,
)
from shared.settings import ObjectStoreSettings

S3A = "spark.hadoop.fs.s3a."


def test_a_self_hosted_store_gets_its_endpoint_path_style_and_key() -> None:
    options = hadoop_options(
        ObjectStoreSettings(
            endpoint="http://127.0.0.1:9000",
            region="eu-west-1",
            path_style=True,
            access_key_id="id",
            secret_access_key=SecretStr("secret"),
        )
    )
    assert options[S3A + "endpoint"] == "http://127.0.0.1:9000"
    assert options[S3A + "endpoint.region"] == "eu-west-1"
    assert options[S3A + "path.style.access"] == "true"
    assert options[S3A + "connection.ssl.enabled"] == "false"  # http://
    assert (options[S3A + "access.key"], options[S3A + "secret.key"]) == ("id", "secret")
    assert options[S3A + "aws.credentials.provider"].endswith("SimpleAWSCredentialsProvider")
    assert all(isinstance(value, str) for value in options.values())


def test_aws_itself_gets_tls_and_the_sdks_own_credentials() -> None:
    options = hadoop_options(ObjectStoreSettings())
    assert S3A + "endpoint" not in options
    assert options[S3A + "connection.ssl.enabled"] == "true"
    assert options[S3A + "path.style.access"] == "false"
    assert S3A + "access.key" not in options and S3A + "secret.key" not in options
    assert options[S3A + "aws.credentials.provider"] == (
        "software.amazon.awssdk.auth.credentials.DefaultCredentialsProvider"
    )
    assert (
        hadoop_options(ObjectStoreSettings(endpoint="https://s3.example"))[
            S3A + "connection.ssl.enabled"
        ]
        == "true"
    )


def test_parquet_commits_through_s3as_magic_committer_without_rename() -> None:
    options = hadoop_options(ObjectStoreSettings())
    assert options["spark.sql.sources.commitProtocolClass"] == (
        "org.apache.spark.internal.io.cloud.PathOutputCommitProtocol"
    )
    assert options["spark.sql.parquet.output.committer.class"] == (
        "org.apache.spark.internal.io.cloud.BindingParquetOutputCommitter"
    )
    assert options[S3A + "committer.name"] == "magic"
    assert options["spark.hadoop.mapreduce.outputcommitter.factory.scheme.s3a"].endswith(
        "S3ACommitterFactory"
    )
    # The checkpoint manager refuses a local filesystem: only for a checkpoint on the store.
    assert CHECKPOINT_MANAGER_CONF not in options
    assert checkpoint_options("s3a://aistack/transform/checkpoint") == {
        CHECKPOINT_MANAGER_CONF: ABORTABLE_CHECKPOINT_MANAGER
    }
    # On this machine's disk, through Hadoop's FileSystem (no readlink per
    # rename); HDFS keeps Spark's default.
    for local in ("/var/lib/aistack/checkpoint", "file:///var/lib/aistack/checkpoint"):
        assert checkpoint_options(local) == {CHECKPOINT_MANAGER_CONF: LOCAL_CHECKPOINT_MANAGER}
    assert checkpoint_options("hdfs://namenode:8020/aistack/checkpoint") == {}


def test_an_outage_fails_after_about_the_ride_out_time() -> None:
    for ride_out_s in (0.0, 1.0, 30.0, 600.0):
        retries = s3a_retry_limit(ride_out_s)
        # S3A waits 0.5 s, then twice as long at each retry.
        waited = 0.5 * (2**retries - 1)
        assert waited <= ride_out_s < 0.5 * (2 ** (retries + 1) - 1)
    options = hadoop_options(ObjectStoreSettings(ride_out_s=30))
    assert options[S3A + "retry.limit"] == "5"
    assert options[S3A + "retry.interval"] == "500ms"
    assert options[S3A + "attempts.maximum"] == "2"
