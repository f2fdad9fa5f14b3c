"""docker-compose.yml checked against the code: no Docker engine runs here."""

from __future__ import annotations

import json
import os
import re
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml
from pydantic_settings import BaseSettings

from compose import kafka_dist
from svc_ingest.settings import IngestSettings
from svc_model.settings import ModelSettings
from svc_monitor.settings import MonitorSettings
from svc_trainer.settings import TrainerSettings
from svc_transform.settings import TransformSettings
from svc_tuner.settings import TunerSettings
from tests import settings_catalog

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose" / "docker-compose.yml"
GPU_OVERRIDE = ROOT / "compose" / "docker-compose.gpu.yml"
BOARD = ROOT / "compose" / "grafana" / "dashboards" / "aistack.json"

SERVICE_SETTINGS: dict[str, type[BaseSettings]] = {
    "svc_ingest": IngestSettings,
    "svc_transform": TransformSettings,
    "svc_tuner": TunerSettings,
    "svc_trainer": TrainerSettings,
    "svc_model": ModelSettings,
    "svc_monitor": MonitorSettings,
}
GRPC_SERVICES = {
    "svc_tuner": "aistack.v1.TunerService",
    "svc_model": "inference.GRPCInferenceService",
}


def load(path: Path) -> dict[str, Any]:
    spec = yaml.safe_load(path.read_text())
    assert isinstance(spec, dict)
    return spec


def aistack_services() -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = load(COMPOSE)["services"]
    return {name: s for name, s in services.items() if name.startswith("svc_")}


def is_bind(source: str) -> bool:
    """A host path (compose resolves it against the file's folder), not a named volume."""
    return source.startswith(("./", "../", "/"))


def mounts(service: dict[str, Any]) -> dict[PurePosixPath, str]:
    """Container path -> named volume, from the short ``volume:path`` syntax."""
    out: dict[PurePosixPath, str] = {}
    for mount in service.get("volumes", []):
        volume, path = mount.split(":")[:2]
        if not is_bind(volume):
            out[PurePosixPath(path)] = volume
    return out


def bind_mounts(service: dict[str, Any]) -> dict[PurePosixPath, tuple[Path, str]]:
    """Container path -> (the checkout's path, mode) of each host path mounted."""
    out: dict[PurePosixPath, tuple[Path, str]] = {}
    for mount in service.get("volumes", []):
        source, path, *mode = mount.split(":")
        if is_bind(source):
            out[PurePosixPath(path)] = ((COMPOSE.parent / source).resolve(), "".join(mode))
    return out


def host_file(service: dict[str, Any], location: str) -> Path:
    """The file of the checkout that a container sees at ``location``."""
    target = PurePosixPath(location)
    for path, (source, _) in bind_mounts(service).items():
        if target == path or path in target.parents:
            return source / target.relative_to(path)
    raise AssertionError(f"{location} is on no host path mounted in the service")


def mount_of(service: dict[str, Any], location: str) -> tuple[str, PurePosixPath]:
    """The named volume and mount point that hold ``location`` in ``service``."""
    target = PurePosixPath(location)
    for path, volume in mounts(service).items():
        if target == path or path in target.parents:
            return volume, path
    raise AssertionError(f"{location} is on no volume of the service")


def service_settings(
    name: str, service: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> BaseSettings:
    """The service's settings as its container builds them: only its environment."""
    for variable in list(os.environ):
        if variable.startswith("AISTACK_"):
            monkeypatch.delenv(variable)
    for variable, value in service["environment"].items():
        monkeypatch.setenv(variable, str(value))
    return SERVICE_SETTINGS[name]()


def test_compose_file_parses_and_names_kafka_and_redis() -> None:
    spec = yaml.safe_load(COMPOSE.read_text())
    services = spec["services"]
    assert {"kafka", "redis"} <= set(services)

    kafka = services["kafka"]
    assert kafka["image"] == f"apache/kafka:{kafka_dist.KAFKA_VERSION}"
    env = kafka["environment"]
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft, no ZooKeeper
    assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == 1
    assert env["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"] == 1
    assert env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"] == 1
    assert "127.0.0.1:9092:9092" in kafka["ports"]

    redis = services["redis"]
    assert redis["image"].startswith("redis:")
    assert "127.0.0.1:6379:6379" in redis["ports"]
    for name in ("kafka", "redis"):
        assert services[name]["healthcheck"]["test"]
    volumes = set(spec["volumes"])
    for service in services.values():
        for mount in service.get("volumes", []):
            source = mount.split(":")[0]
            if is_bind(source):
                assert (COMPOSE.parent / source).exists(), f"{source} is not in the checkout"
            else:
                assert source in volumes


def test_every_aistack_service_runs_and_every_service_package_is_there() -> None:
    services = aistack_services()
    packages = {p.parent.name for p in ROOT.glob("svc_*/__main__.py")}
    assert set(services) == packages == set(SERVICE_SETTINGS)
    for name, service in services.items():
        assert (ROOT / name / "__main__.py").is_file()
        assert service["command"] == ["python", "-m", name]


def test_every_build_uses_the_dockerfile_with_existing_dependency_groups() -> None:
    groups = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    )
    for name, service in aistack_services().items():
        build = service["build"]
        context = (COMPOSE.parent / build["context"]).resolve()
        assert (context / "pyproject.toml").is_file(), f"{name}: context is not the project root"
        assert (context / build["dockerfile"]).is_file(), f"{name}: no {build['dockerfile']}"
        extras = str(build["args"]["EXTRAS"]).split()
        assert set(extras) <= groups, f"{name}: unknown groups {set(extras) - groups}"
        assert name.removeprefix("svc_") in extras, f"{name}: its own group is not installed"
        assert "dev" not in extras  # test tools stay out of the images


def test_dockerfile_builds_what_the_services_need() -> None:
    paths = {
        (COMPOSE.parent / s["build"]["context"] / s["build"]["dockerfile"]).resolve()
        for s in aistack_services().values()
    }
    assert len(paths) == 1, "one Dockerfile for every service"
    text = paths.pop().read_text()
    assert re.search(r"^ARG EXTRAS", text, re.MULTILINE)
    assert "python:3.11-slim" in text
    assert "uv sync --frozen" in text  # from uv.lock
    assert "python -m shared.contracts.codegen" in text
    assert "grpcio-tools" in text
    assert "openjdk-17-jre-headless" in text  # Spark's driver in the transform image
    assert "-m svc_transform.jars" in text  # its Kafka connector via Maven, its functions
    assert "-m svc_ingest.sensor_bytes_build" in text  # the cleaner's compiled path
    # Settings the image itself sets (where the jars it built are) are real ones.
    image_settings = set(re.findall(r"\b(AISTACK_[A-Z0-9_]+)=", text))
    assert image_settings <= settings_catalog.env_names(), image_settings
    # Every directory the build copies exists in the checkout.
    for source in re.findall(r"^COPY (?!--from)(.+) \S+$", text, re.MULTILINE):
        for path in source.split():
            assert (ROOT / path).exists(), f"the Dockerfile copies {path}, which is missing"


def test_every_aistack_variable_is_a_real_setting() -> None:
    known = settings_catalog.env_names()
    for name, service in load(COMPOSE)["services"].items():
        environment = service.get("environment", {})
        assert isinstance(environment, dict), f"{name}: environment must be a mapping"
        unknown = sorted(v for v in environment if v.startswith("AISTACK_") and v not in known)
        assert not unknown, f"{name}: not settings of the code: {unknown}"


@pytest.mark.parametrize("name", sorted(SERVICE_SETTINGS))
def test_each_service_environment_is_valid_and_uses_the_compose_network(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = load(COMPOSE)
    service = spec["services"][name]
    settings: Any = service_settings(name, service, monkeypatch)
    # The broker's internal listener, as it advertises it to other containers.
    advertised = spec["services"]["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    assert f"INTERNAL://{settings.kafka.bootstrap}" in advertised.split(",")
    assert settings.redis.url == "redis://redis:6379/0"
    assert str(settings.common.state_dir) == "/var/lib/aistack"


@pytest.mark.parametrize("name", sorted(SERVICE_SETTINGS))
def test_health_checks_probe_the_ports_the_service_serves(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = aistack_services()[name]
    settings: Any = service_settings(name, service, monkeypatch)
    test = service["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"]
    compile(test[3], f"<{name} healthcheck>", "exec")  # a valid one-liner
    if name in GRPC_SERVICES:
        port = int(settings.grpc_address.rpartition(":")[2])
        assert "grpc_health" in test[3]
        assert f"'127.0.0.1:{port}'" in test[3]
        assert f"service='{GRPC_SERVICES[name]}'" in test[3]
    else:
        assert "urllib.request" in test[3]
        assert f"http://127.0.0.1:{settings.metrics_port}/metrics" in test[3]
        assert settings.metrics_port


def test_every_service_has_a_health_check() -> None:
    for name, service in load(COMPOSE)["services"].items():
        assert service.get("healthcheck", {}).get("test"), f"{name} has no health check"


def test_every_service_waits_for_healthy_kafka_and_redis() -> None:
    for name, service in aistack_services().items():
        for dependency in ("kafka", "redis"):
            assert service["depends_on"][dependency] == {"condition": "service_healthy"}, name


def test_grpc_ports_are_published() -> None:
    services = aistack_services()
    assert "127.0.0.1:50051:50051" in services["svc_tuner"]["ports"]
    assert "127.0.0.1:8001:8001" in services["svc_model"]["ports"]


def test_every_published_port_listens_on_this_host_only() -> None:
    for name, service in load(COMPOSE)["services"].items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} to the network"


def test_redis_asks_for_a_password_every_service_has() -> None:
    services = load(COMPOSE)["services"]
    command = services["redis"]["command"]
    required = command[command.index("--requirepass") + 1]
    assert required.startswith("${AISTACK_REDIS_PASSWORD:?")  # compose refuses to start without
    assert services["redis"]["environment"]["REDISCLI_AUTH"] == required  # its health check
    for name, service in aistack_services().items():
        assert service["environment"]["AISTACK_REDIS_PASSWORD"] == required, name


def test_trainers_scale() -> None:
    trainer = aistack_services()["svc_trainer"]
    # `--scale svc_trainer=N`: a fixed name, host port or host name would clash
    # (the host name also names each replica in its reports).
    for key in ("container_name", "ports", "hostname"):
        assert key not in trainer, f"svc_trainer has {key}"


def test_trainer_model_and_transform_share_their_files(monkeypatch: pytest.MonkeyPatch) -> None:
    services = aistack_services()
    trainer: Any = service_settings("svc_trainer", services["svc_trainer"], monkeypatch)
    transform: Any = service_settings("svc_transform", services["svc_transform"], monkeypatch)
    # svc_model opens the file:// URI the trainer wrote: same volume, same path.
    artifacts = mount_of(services["svc_trainer"], trainer.artifact_location())
    assert mount_of(services["svc_model"], trainer.artifact_location()) == artifacts, (
        "svc_model must mount the trainers' artifact volume at the same path"
    )
    # The trainers read the offline feature store where svc_transform writes it.
    assert trainer.features_location() == transform.offline_path()
    features = mount_of(services["svc_transform"], transform.offline_path())
    assert mount_of(services["svc_trainer"], trainer.features_location()) == features, (
        "svc_trainer must mount svc_transform's feature volume at the same path"
    )


def test_gpu_override_reserves_gpus_for_trainers_only() -> None:
    override = load(GPU_OVERRIDE)["services"]
    assert set(override) <= set(load(COMPOSE)["services"])
    reserving = {}
    for name, service in override.items():
        devices = service.get("deploy", {}).get("resources", {}).get("reservations", {})
        if devices.get("devices"):
            reserving[name] = devices["devices"]
    assert set(reserving) == {"svc_trainer"}
    [device] = reserving["svc_trainer"]
    assert device["driver"] == "nvidia"
    assert device["count"] == "all"
    assert "gpu" in device["capabilities"]
    # ... and builds their image with TensorFlow's CUDA build.
    assert override["svc_trainer"]["build"]["args"]["EXTRAS"] == "trainer-gpu"
    # The main file runs on hosts without GPUs: no reservation there.
    for name, service in load(COMPOSE)["services"].items():
        assert "deploy" not in service, f"{name} reserves resources in the main file"


def test_the_dashboards_read_what_the_tuner_and_the_trainers_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """optuna-dashboard is the tuner's own entry point on the tuner's journal
    and serves where it is published and probed; TensorBoard reads the runs
    directory the trainers write, on the same volume."""
    services = load(COMPOSE)["services"]
    optuna = services["optuna-dashboard"]
    assert optuna["command"] == ["python", "-m", "svc_tuner.dashboard"]
    assert (ROOT / "svc_tuner" / "dashboard.py").is_file()
    assert {"tuner", "dashboard"} <= set(str(optuna["build"]["args"]["EXTRAS"]).split())
    tuner: Any = service_settings("svc_tuner", services["svc_tuner"], monkeypatch)
    dashboard: Any = service_settings("svc_tuner", optuna, monkeypatch)
    assert (dashboard.redis.url, dashboard.storage_prefix) == (
        tuner.redis.url,
        tuner.storage_prefix,
    )
    port = dashboard.dashboard_port
    assert f"127.0.0.1:{port}:{port}" in optuna["ports"]
    assert f"http://127.0.0.1:{port}/" in optuna["healthcheck"]["test"][3]

    board = services["tensorboard"]
    assert "dashboard" in str(board["build"]["args"]["EXTRAS"]).split()
    trainer_service = services["svc_trainer"]
    trainer: Any = service_settings("svc_trainer", trainer_service, monkeypatch)
    runs = str(trainer.tensorboard_location())
    command = board["command"]
    assert command[:3] == ["python", "-m", "tensorboard.main"]
    assert f"--logdir={runs}" in command
    assert mount_of(board, runs)[0] == mount_of(trainer_service, runs)[0]
    port = next(int(a.split("=")[1]) for a in command if a.startswith("--port="))
    assert f"127.0.0.1:{port}:{port}" in board["ports"]
    assert f"http://127.0.0.1:{port}/" in board["healthcheck"]["test"][3]


def prometheus_config() -> dict[str, Any]:
    prometheus = load(COMPOSE)["services"]["prometheus"]
    [flag] = [a for a in prometheus["command"] if a.startswith("--config.file=")]
    return load(host_file(prometheus, flag.partition("=")[2]))


def scraped() -> dict[str, tuple[int, str]]:
    """Host -> the port Prometheus scrapes there and how it finds it
    (``static``: one address; ``dns``: every address the name resolves to)."""
    found: dict[str, tuple[int, str]] = {}
    for job in prometheus_config()["scrape_configs"]:
        hosts: dict[str, tuple[int, str]] = {}
        for static in job.get("static_configs", []):
            for target in static["targets"]:
                host, _, port = target.rpartition(":")
                hosts[host] = (int(port), "static")
        for dns in job.get("dns_sd_configs", []):
            assert dns["type"] == "A", "one target per address: each replica's"
            hosts.update({host: (int(dns["port"]), "dns") for host in dns["names"]})
        # The job label names the service on the board.
        assert set(hosts) == {job["job_name"]}, job["job_name"]
        assert not set(hosts) & set(found), f"{job['job_name']} is scraped twice"
        found.update(hosts)
    return found


def test_prometheus_scrapes_every_aistack_service_and_each_trainer() -> None:
    found = scraped()
    assert set(found) == set(aistack_services())
    # `--scale svc_trainer=N`: compose's DNS answers the name with every
    # replica; a static target would reach one of them at random.
    assert found["svc_trainer"][1] == "dns"


@pytest.mark.parametrize("name", sorted(SERVICE_SETTINGS))
def test_prometheus_scrapes_each_service_where_it_serves_its_metrics(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings: Any = service_settings(name, aistack_services()[name], monkeypatch)
    port, _ = scraped()[name]
    assert port == settings.metrics_port != 0
    # Prometheus is another container: on loopback the service would refuse it.
    assert settings.common.metrics_host == "0.0.0.0"


def test_grafana_shows_the_board_on_prometheus_to_anyone_on_this_host() -> None:
    services = load(COMPOSE)["services"]
    grafana = services["grafana"]
    env = grafana["environment"]
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "true"
    assert env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"  # to look, not to edit
    assert host_file(grafana, env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]) == BOARD
    assert "127.0.0.1:3000:3000" in grafana["ports"]
    assert "127.0.0.1:9090:9090" in services["prometheus"]["ports"]

    sources = [
        source
        for path in host_file(grafana, "/etc/grafana/provisioning/datasources").glob("*.yml")
        for source in load(path)["datasources"]
    ]
    [source] = sources
    assert source["type"] == "prometheus"
    # Prometheus's container by its compose name, on the port it listens on.
    assert source["url"] == "http://prometheus:9090"
    assert "prometheus" in services
    assert not any(a.startswith("--web.listen-address") for a in services["prometheus"]["command"])
    # $__rate_interval spans at least four of these: several scrapes.
    assert source["jsonData"]["timeInterval"] == prometheus_config()["global"]["scrape_interval"]

    board = json.loads(BOARD.read_text())
    uids = set()
    for panel in board["panels"]:
        for ref in [panel, *panel.get("targets", [])]:
            if "datasource" in ref:
                uids.add(ref["datasource"]["uid"])
    assert uids == {source["uid"]}

    providers = [
        provider
        for path in host_file(grafana, "/etc/grafana/provisioning/dashboards").glob("*.yml")
        for provider in load(path)["providers"]
    ]
    assert [host_file(grafana, p["options"]["path"]) for p in providers] == [BOARD.parent]


def test_prometheus_and_grafana_are_pinned_and_read_their_files_only() -> None:
    services = load(COMPOSE)["services"]
    # A full version: a floating tag would change Grafana under the board.
    assert re.fullmatch(r"prom/prometheus:v\d+\.\d+\.\d+", services["prometheus"]["image"])
    assert re.fullmatch(r"grafana/grafana:\d+\.\d+\.\d+", services["grafana"]["image"])
    for name in ("prometheus", "grafana"):
        binds = bind_mounts(services[name])
        assert binds, f"{name} mounts no configuration"
        for path, (source, mode) in binds.items():
            assert mode == "ro", f"{name} may write to {source} at {path}"


OBJECT_STORE_OVERRIDE = ROOT / "compose" / "docker-compose.object-store.yml"


def test_object_store_override_puts_every_file_on_the_bucket() -> None:
    from shared.settings import ObjectStoreSettings

    override = load(OBJECT_STORE_OVERRIDE)["services"]
    main = load(COMPOSE)["services"]
    assert {"minio", "minio-buckets"} <= set(override)
    assert override["minio"]["image"].startswith("minio/minio:RELEASE.")
    for port in override["minio"]["ports"]:
        assert port.startswith("127.0.0.1:"), port
    known = settings_catalog.env_names()
    for name in ("svc_transform", "svc_trainer", "svc_model"):
        assert name in main
        service = override[name]
        assert service["depends_on"]["minio-buckets"]["condition"] == (
            "service_completed_successfully"
        )
        env = service["environment"]
        assert set(env) <= known, set(env) - known
        assert env["AISTACK_OBJECT_STORE_ENDPOINT"] == "http://minio:9000"
        ObjectStoreSettings(
            endpoint=env["AISTACK_OBJECT_STORE_ENDPOINT"],
            path_style=env["AISTACK_OBJECT_STORE_PATH_STYLE"] == "true",
        )
    transform = override["svc_transform"]["environment"]
    trainer = override["svc_trainer"]["environment"]
    # The trainers read the windows svc_transform writes: the same objects.
    assert transform["AISTACK_TRANSFORM_OFFLINE_DIR"].removeprefix("s3a://") == trainer[
        "AISTACK_TRAINER_FEATURES_PATH"
    ].removeprefix("s3://")
    assert transform["AISTACK_TRANSFORM_CHECKPOINT_DIR"].startswith("s3a://aistack/")
    assert trainer["AISTACK_TRAINER_ARTIFACT_ROOT"].startswith("s3://aistack/")
    assert override["minio-buckets"]["entrypoint"][-1] == "aistack/aistack"
