"""Typed settings, read once at start-up from ``AISTACK_…`` variables.

Each service composes one frozen settings object from these parts. This is
the only module that reads the environment. A bad value stops start-up with
one line naming the variable (``load_settings``).
"""

from __future__ import annotations

import os
import re
import ssl
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from shared.errors import ConfigError

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
#: Mechanisms Kafka knows that no aistack client is wired for (a token
#: provider, a Kerberos keytab): refused at start-up rather than failing later.
UNWIRED_SASL_MECHANISMS = ("OAUTHBEARER", "GSSAPI")


def _xdg_dir(variable: str, fallback: str) -> Path:
    base = os.environ.get(variable) or str(Path.home() / fallback)
    return Path(base) / "aistack"


def default_state_dir() -> Path:
    """Broker data, checkpoints, artifacts: never inside the checkout."""
    return _xdg_dir("XDG_STATE_HOME", ".local/state")


def default_cache_dir() -> Path:
    """Downloaded jars and other things that can be fetched again."""
    return _xdg_dir("XDG_CACHE_HOME", ".cache")


class CommonSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AISTACK_", frozen=True, extra="ignore")

    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["json", "console"] = "json"
    state_dir: Path = Field(default_factory=default_state_dir)
    cache_dir: Path = Field(default_factory=default_cache_dir)
    # /metrics answers anyone who reaches it, without credentials: this host
    # only, unless a scraper elsewhere needs it (0.0.0.0 in a container).
    metrics_host: str = Field(default="127.0.0.1", min_length=1)

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value


#: The longest a Kafka client waits between tries to reach a broker that is away.
RECONNECT_BACKOFF_MAX_MS = 1000


class KafkaSettings(BaseSettings):
    """Every Kafka client (confluent-kafka, aiokafka/Faust, Spark) is built from this."""

    model_config = SettingsConfigDict(env_prefix="AISTACK_KAFKA_", frozen=True, extra="ignore")

    bootstrap: str = "localhost:9092"
    security_protocol: SecurityProtocol = "PLAINTEXT"
    sasl_mechanism: SaslMechanism | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_cafile: Path | None = None
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    ssl_key_password: SecretStr | None = None
    client_id: str = "aistack"
    # Defaults for topics aistack creates (topic administration).
    topic_partitions: int = Field(default=3, ge=1, le=10_000)
    topic_replication_factor: int = Field(default=1, ge=1, le=16)
    # Writes with acks=all fail when fewer replicas are in sync: 2 of 3 keeps a
    # topic writable through one broker's loss without losing an acked record.
    topic_min_insync_replicas: int = Field(default=1, ge=1, le=16)

    @field_validator("sasl_mechanism", mode="before")
    @classmethod
    def _wired_mechanism(cls, value: Any) -> Any:
        if isinstance(value, str) and value.upper() in UNWIRED_SASL_MECHANISMS:
            raise ValueError(
                f"{value} is not wired into aistack's Kafka clients; "
                "use PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"
            )
        return value

    @field_validator("bootstrap")
    @classmethod
    def _check_bootstrap(cls, value: str) -> str:
        servers = [s.strip() for s in value.split(",") if s.strip()]
        if not servers:
            raise ValueError("expected host:port[,host:port...], got an empty value")
        for server in servers:
            host, sep, port = server.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError("expected host:port[,host:port...]")
        return ",".join(servers)

    @field_validator("ssl_cafile", "ssl_certfile", "ssl_keyfile")
    @classmethod
    def _file_exists(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"no such file: {value}")
        return value

    @model_validator(mode="after")
    def _check_replicas(self) -> KafkaSettings:
        if self.topic_min_insync_replicas > self.topic_replication_factor:
            raise ValueError(
                f"AISTACK_KAFKA_TOPIC_MIN_INSYNC_REPLICAS ({self.topic_min_insync_replicas}) "
                f"exceeds AISTACK_KAFKA_TOPIC_REPLICATION_FACTOR "
                f"({self.topic_replication_factor}): no write could ever succeed"
            )
        return self

    @model_validator(mode="after")
    def _check_sasl(self) -> KafkaSettings:
        if self.security_protocol.startswith("SASL") and self.sasl_mechanism is None:
            raise ValueError(
                f"AISTACK_KAFKA_SASL_MECHANISM is required with security protocol "
                f"{self.security_protocol}"
            )
        if self.sasl_mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512") and not (
            self.sasl_username and self.sasl_password
        ):
            raise ValueError(
                "AISTACK_KAFKA_SASL_USERNAME and AISTACK_KAFKA_SASL_PASSWORD are required "
                f"with SASL mechanism {self.sasl_mechanism}"
            )
        return self

    def client_config(self) -> dict[str, Any]:
        """librdkafka settings (confluent-kafka) for connection and security."""
        config: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap,
            "client.id": self.client_id,
            "security.protocol": self.security_protocol,
            # Back within a second of a restarted broker, not librdkafka's
            # default 10 s of back-off (the Java client's default is 1 s too).
            "reconnect.backoff.max.ms": RECONNECT_BACKOFF_MAX_MS,
        }
        if self.sasl_mechanism:
            config["sasl.mechanism"] = self.sasl_mechanism
        if self.sasl_username:
            config["sasl.username"] = self.sasl_username
        if self.sasl_password:
            config["sasl.password"] = self.sasl_password.get_secret_value()
        if self.ssl_cafile:
            config["ssl.ca.location"] = str(self.ssl_cafile)
        if self.ssl_certfile:
            config["ssl.certificate.location"] = str(self.ssl_certfile)
        if self.ssl_keyfile:
            config["ssl.key.location"] = str(self.ssl_keyfile)
        if self.ssl_key_password:
            config["ssl.key.password"] = self.ssl_key_password.get_secret_value()
        return config

    def java_client_config(self) -> dict[str, str]:
        """The same for Kafka's Java client (Spark's connector takes each with a
        ``kafka.`` prefix); PEM files are read as they are, no keystore needed."""
        config = {
            "bootstrap.servers": self.bootstrap,
            "client.id": self.client_id,
            "security.protocol": self.security_protocol,
        }
        if self.sasl_mechanism:
            config["sasl.mechanism"] = self.sasl_mechanism
            module = {
                "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
                "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
                "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
            }.get(self.sasl_mechanism)
            if module and self.sasl_username and self.sasl_password:
                config["sasl.jaas.config"] = (
                    f'{module} required username="{_jaas_quote(self.sasl_username)}" '
                    f'password="{_jaas_quote(self.sasl_password.get_secret_value())}";'
                )
        if self.ssl_cafile:
            config["ssl.truststore.type"] = "PEM"
            config["ssl.truststore.location"] = str(self.ssl_cafile)
        if self.ssl_certfile:
            config["ssl.keystore.type"] = "PEM"
            config["ssl.keystore.certificate.chain"] = self.ssl_certfile.read_text()
            if self.ssl_keyfile:
                config["ssl.keystore.key"] = self.ssl_keyfile.read_text()
            if self.ssl_key_password:
                config["ssl.key.password"] = self.ssl_key_password.get_secret_value()
        return config

    def aiokafka_config(self) -> dict[str, Any]:
        """The same connection and security for aiokafka (and so Faust)."""
        config: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap,
            "client_id": self.client_id,
            "security_protocol": self.security_protocol,
        }
        if self.security_protocol in ("SSL", "SASL_SSL"):
            context = ssl.create_default_context(
                cafile=str(self.ssl_cafile) if self.ssl_cafile else None
            )
            if self.ssl_certfile:
                context.load_cert_chain(
                    str(self.ssl_certfile),
                    str(self.ssl_keyfile) if self.ssl_keyfile else None,
                    self.ssl_key_password.get_secret_value() if self.ssl_key_password else None,
                )
            config["ssl_context"] = context
        if self.sasl_mechanism:
            config["sasl_mechanism"] = self.sasl_mechanism
        if self.sasl_username:
            config["sasl_plain_username"] = self.sasl_username
        if self.sasl_password:
            config["sasl_plain_password"] = self.sasl_password.get_secret_value()
        return config


def _jaas_quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


#: Which version of a model serves (``shared.model_registry.serving``):
#: "champion", by ``shared.objective.champion`` (validation values, then
#: svc_monitor's decisions on live traffic); "live", the same except that a
#: re-tuned version never takes over by validation values: it runs in the
#: champion's shadow until a decision on live traffic promotes it; "latest",
#: the newest version always.
ServingPolicy = Literal["champion", "live", "latest"]


class ServingSettings(BaseSettings):
    """Which version of each model serves: one setting for the model server
    and every reader that must agree with it (the drift monitor watches the
    version served; batch scoring and the client take it for a model named
    without a version)."""

    model_config = SettingsConfigDict(env_prefix="AISTACK_MODEL_", frozen=True, extra="ignore")

    policy: ServingPolicy = "champion"
    # How many challengers of a model run in its serving version's shadow
    # (shared.model_registry.challengers: the newest marked or re-tuned); 0: none.
    challengers: int = Field(default=1, ge=0, le=8)


class RedisSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AISTACK_REDIS_", frozen=True, extra="ignore")

    # rediss:// turns TLS on.
    url: str = "redis://localhost:6379/0"
    # An ACL user (Redis 6+); none: the default user.
    username: str | None = None
    password: SecretStr | None = None
    ssl_ca_certs: Path | None = None

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        if not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"expected a redis://, rediss:// or unix:// URL, got {value!r}")
        return value


class ObjectStoreSettings(BaseSettings):
    """How every service reaches the S3-compatible object store its ``s3://``
    (fsspec's s3fs) and ``s3a://`` (Hadoop's S3A, in Spark) URLs name: AWS
    S3, MinIO, Ceph, GCS through its S3 interoperability, or the local
    stack's own (``aistack infra up --object-store``)."""

    model_config = SettingsConfigDict(
        env_prefix="AISTACK_OBJECT_STORE_", frozen=True, extra="ignore"
    )

    # http(s)://host:port of a store that is not AWS S3; empty: AWS S3's own
    # endpoint for the region.
    endpoint: str = ""
    region: str = Field(default="us-east-1", min_length=1)
    # Buckets as paths (http://host/bucket/key), as MinIO and most
    # self-hosted stores need; False: AWS's virtual-host names.
    path_style: bool = False
    # Empty: the SDKs' own chain (AWS_* variables, ~/.aws, an instance role).
    access_key_id: str = ""
    secret_access_key: SecretStr | None = None
    # How long a read or write waits for a store that is away (connection
    # refused, reset, timed out) before it fails, retryable, naming the store.
    ride_out_s: float = Field(default=30.0, ge=0, le=3600)

    @field_validator("endpoint")
    @classmethod
    def _check_endpoint(cls, value: str) -> str:
        if value and not value.startswith(("http://", "https://")):
            raise ValueError(f"expected an http:// or https:// URL, got {value!r}")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _check_credentials(self) -> ObjectStoreSettings:
        if bool(self.access_key_id) != (self.secret_access_key is not None):
            raise ValueError(
                "set both AISTACK_OBJECT_STORE_ACCESS_KEY_ID and "
                "AISTACK_OBJECT_STORE_SECRET_ACCESS_KEY, or neither"
            )
        return self


# local, local[4], local[*], local[4,2] (retries), spark://h:p[,h:p], k8s://…, yarn.
_MASTER = re.compile(
    r"^(local(\[(\*|[1-9][0-9]*)(,[1-9][0-9]*)?\])?"
    r"|spark://[^/\s]+:[0-9]+(,[^/\s]+:[0-9]+)*"
    r"|k8s://\S+"
    r"|yarn)$"
)


class SparkSettings(BaseSettings):
    """Where Spark runs and how it is sized; read by every Spark job
    (svc_transform's stream, svc_score's batch)."""

    model_config = SettingsConfigDict(env_prefix="AISTACK_SPARK_", frozen=True, extra="ignore")

    master: str = "local[*]"
    # 0: the cores of local[N], else this machine's cores (set it for a
    # cluster); Spark's default of 200 makes a 2-core micro-batch take 13 s.
    shuffle_partitions: int = Field(default=0, ge=0, le=100_000)
    # In local mode the driver runs the tasks too: with Spark's 1g, reading a
    # backlog, svc_transform's G1 collector took 5 s of CPU a 600,000 events
    # (its concurrent marking most of it), with 2g 1.2 s.
    driver_memory: str = Field(default="2g", pattern=r"^[1-9][0-9]*[kmgt]$")
    # Extra Spark settings as JSON {"spark.executor.memory": "4g"}, passed as
    # spark-submit's --conf would.
    conf: dict[str, str] = Field(default_factory=dict)

    @field_validator("master")
    @classmethod
    def _check_master(cls, value: str) -> str:
        if not _MASTER.match(value):
            raise ValueError(
                "expected local[*], local[N], spark://host:port, k8s://https://host:port or yarn"
            )
        return value

    def is_local(self) -> bool:
        return self.master.startswith("local")

    def partitions(self) -> int:
        """``spark.sql.shuffle.partitions`` for this master."""
        if self.shuffle_partitions:
            return self.shuffle_partitions
        match = re.match(r"^local\[([0-9]+)", self.master)
        if match:
            return int(match.group(1))
        if self.master == "local":
            return 1
        return os.cpu_count() or 2


class ServiceSettings(BaseSettings):
    """Base of every service's settings: the common parts, then its own fields.

    A service subclasses it with its own ``env_prefix`` (``AISTACK_TUNER_``…)
    and ``frozen=True``; the shared parts keep their shared variable names.
    """

    model_config = SettingsConfigDict(env_prefix="AISTACK_", frozen=True, extra="ignore")

    common: CommonSettings = Field(default_factory=CommonSettings)
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    redis: RedisSettings = Field(default_factory=RedisSettings)
    object_store: ObjectStoreSettings = Field(default_factory=ObjectStoreSettings)


SettingsT = TypeVar("SettingsT", bound=BaseSettings)


def _env_name(model_name: str, field: str, root: type[BaseSettings]) -> str:
    candidates: list[type[BaseSettings]] = [root]
    candidates += [c for c in _all_subclasses(BaseSettings) if c.__name__ == model_name]
    for cls in candidates:
        if cls.__name__ == model_name and field in cls.model_fields:
            return f"{cls.model_config.get('env_prefix', '')}{field}".upper()
    return f"{root.model_config.get('env_prefix', '')}{field}".upper()


def _all_subclasses(cls: type) -> list[type]:
    out: list[type] = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_all_subclasses(sub))
    return out


def load_settings(cls: type[SettingsT]) -> SettingsT:
    """Build ``cls`` from the environment; raise ConfigError naming the variable."""
    try:
        return cls()
    except ValidationError as exc:
        error = exc.errors()[0]
        loc = [str(part) for part in error["loc"]]
        field = loc[0] if loc else ""
        message = str(error["msg"]).removeprefix("Value error, ")
        if not field:  # a model-level check: its message names the variables
            raise ConfigError(f"bad setting: {message}") from exc
        name = _env_name(exc.title, field, cls)
        got = error.get("input")
        shown = "" if isinstance(got, dict) or "password" in field else f" (got {got!r})"
        raise ConfigError(f"bad setting {name}: {message}{shown}") from exc
    except SettingsError as exc:
        raise ConfigError(f"bad setting: {exc}") from exc
