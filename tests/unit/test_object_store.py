"""The object store's settings and URLs, and how an outage is ridden out."""

from __future__ import annotations

import pytest

from shared import object_store
from shared.errors import ConfigError, Unavailable
from shared.settings import ObjectStoreSettings, load_settings


def test_the_local_store_s_settings_become_s3fs_options() -> None:
    settings = ObjectStoreSettings(
        endpoint="http://127.0.0.1:9000/",
        path_style=True,
        access_key_id="aistack",
        secret_access_key="s3cret",  # type: ignore[arg-type]
        region="eu-west-1",
    )
    assert settings.endpoint == "http://127.0.0.1:9000"
    options = object_store.s3fs_options(settings)
    assert options["endpoint_url"] == "http://127.0.0.1:9000"
    assert options["key"] == "aistack" and options["secret"] == "s3cret"
    assert options["client_kwargs"] == {"region_name": "eu-west-1"}
    assert options["config_kwargs"]["s3"] == {"addressing_style": "path"}
    assert "s3cret" not in repr(settings)


def test_without_credentials_the_sdk_s_own_chain_is_used() -> None:
    options = object_store.s3fs_options(ObjectStoreSettings())
    assert "key" not in options and "secret" not in options and "endpoint_url" not in options
    assert "s3" not in options["config_kwargs"]  # AWS's virtual-host names


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"AISTACK_OBJECT_STORE_ENDPOINT": "127.0.0.1:9000"}, "AISTACK_OBJECT_STORE_ENDPOINT"),
        ({"AISTACK_OBJECT_STORE_ACCESS_KEY_ID": "only-the-key"}, "AISTACK_OBJECT_STORE"),
        ({"AISTACK_OBJECT_STORE_RIDE_OUT_S": "-1"}, "AISTACK_OBJECT_STORE_RIDE_OUT_S"),
    ],
)
def test_a_bad_setting_stops_start_up_naming_it(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], named: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=named):
        load_settings(ObjectStoreSettings)


def test_hadoop_and_fsspec_name_the_same_object() -> None:
    assert object_store.fsspec_url("s3a://aistack/features") == "s3://aistack/features"
    assert object_store.hadoop_url("s3://aistack/features") == "s3a://aistack/features"
    assert object_store.hadoop_url("/var/lib/x") == "/var/lib/x"
    assert object_store.is_object_url("S3A://b/k") and not object_store.is_object_url("ftp://h/k")
    fs, path = object_store.filesystem("s3a://aistack/features/", ObjectStoreSettings())
    assert path == "aistack/features" and "s3" in fs.protocol


def test_an_unknown_scheme_is_a_clear_error() -> None:
    from shared.errors import FailedPrecondition

    with pytest.raises(FailedPrecondition, match="no fsspec backend"):
        object_store.filesystem("nosuchscheme://bucket/key", ObjectStoreSettings())


def test_an_outage_is_tried_again_until_the_store_answers() -> None:
    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionRefusedError("refused")
        return "written"

    assert object_store.ride_out(flaky, seconds=30, what="store") == "written"
    assert len(calls) == 3


def test_a_store_away_past_the_ride_out_is_unavailable_naming_it() -> None:
    def away() -> None:
        raise ConnectionResetError("reset by peer")

    with pytest.raises(Unavailable, match=r"object store http://s3\.local: write x: unreachable"):
        object_store.ride_out(away, seconds=0, what="object store http://s3.local: write x")


def test_what_the_store_answers_is_not_retried() -> None:
    calls: list[int] = []

    def denied() -> None:
        calls.append(1)
        raise PermissionError("Access Denied")

    with pytest.raises(PermissionError):
        object_store.ride_out(denied, seconds=30, what="store")
    assert calls == [1]


def test_botocore_s_connection_errors_are_outages() -> None:
    from botocore.exceptions import EndpointConnectionError, ReadTimeoutError

    assert object_store.is_outage(EndpointConnectionError(endpoint_url="http://x"))
    assert object_store.is_outage(ReadTimeoutError(endpoint_url="http://x"))
    assert not object_store.is_outage(FileNotFoundError("no such key"))


def test_the_command_line_takes_the_offline_store_on_the_bucket_as_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``aistack models register --feature`` reads the offline store where
    the trainers do, a URL kept whole (a Path would fold ``s3://`` to ``s3:/``)."""
    from aistack.settings import ClientSettings

    monkeypatch.setenv("AISTACK_TRAINER_FEATURES_PATH", "s3://aistack/features/windows")
    monkeypatch.setenv("AISTACK_OBJECT_STORE_ENDPOINT", "http://127.0.0.1:9000")
    settings = load_settings(ClientSettings)
    assert settings.features_path() == "s3://aistack/features/windows"
    assert settings.lineage.object_store.endpoint == "http://127.0.0.1:9000"
