"""Where the client finds the platform: read once from ``AISTACK_…``
variables (``ClientSettings``), each overridable by ``Client``'s arguments.

The names are the services' own where both sides need the same value: the
token a server checks is the one its clients send (``AISTACK_TUNER_AUTH_TOKEN``,
``AISTACK_MODEL_AUTH_TOKEN``), and shipped code and registered models go to
the trainers' artifact store (``AISTACK_TRAINER_ARTIFACT_ROOT``).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.bus.topics import MODELS_DECISIONS, MODELS_READY, MONITORING_PERFORMANCE, PREDICTIONS
from shared.settings import ServiceSettings, ServingSettings


class TunerClientSettings(BaseSettings):
    """svc_tuner's address, and how to reach it."""

    # An empty variable means unset, as for a shell's ${VAR:-default}.
    model_config = SettingsConfigDict(
        env_prefix="AISTACK_TUNER_", frozen=True, extra="ignore", env_ignore_empty=True
    )

    target: str = "localhost:50051"
    # A CA file: the client then connects with TLS.
    tls_ca_file: Path | None = None
    # A certificate and its key for a server that asks for one (its
    # AISTACK_TUNER_TLS_CLIENT_CA_FILE: mutual TLS).
    tls_client_cert_file: Path | None = None
    tls_client_key_file: Path | None = None
    auth_token: SecretStr | None = None


class ModelClientSettings(BaseSettings):
    """svc_model's Open Inference Protocol address, and how to reach it."""

    model_config = SettingsConfigDict(
        env_prefix="AISTACK_MODEL_", frozen=True, extra="ignore", env_ignore_empty=True
    )

    target: str = "localhost:8001"
    tls_ca_file: Path | None = None
    tls_client_cert_file: Path | None = None
    tls_client_key_file: Path | None = None
    auth_token: SecretStr | None = None


class ArtifactClientSettings(BaseSettings):
    """The trainers' artifact store, where shipped code and registered models
    go (a directory or an fsspec URL), and the offline store they read."""

    model_config = SettingsConfigDict(
        env_prefix="AISTACK_TRAINER_", frozen=True, extra="ignore", env_ignore_empty=True
    )

    artifact_root: str = ""
    features_path: str = ""


class LineageSettings(ServiceSettings):
    """The logs a lineage walk and the model registry read, and Kafka."""

    model_config = SettingsConfigDict(env_prefix="AISTACK_LINEAGE_", frozen=True, extra="ignore")

    predictions_topic: str = PREDICTIONS
    # The model registry (svc_trainer's AISTACK_TRAINER_MODELS_TOPIC).
    models_topic: str = MODELS_READY
    # Each version's live error (svc_monitor's AISTACK_MONITOR_PERFORMANCE_TOPIC).
    performance_topic: str = MONITORING_PERFORMANCE
    # The champion rule's decisions (svc_monitor's AISTACK_MONITOR_DECISIONS_TOPIC).
    decisions_topic: str = MODELS_DECISIONS
    # Which version serves (AISTACK_MODEL_POLICY): the one a model named
    # without a version means.
    serving: ServingSettings = Field(default_factory=ServingSettings)
    # How long reading one topic to its end may take.
    timeout_seconds: float = Field(default=60.0, gt=0, le=3600)
    # How many raw records each branch prints.
    raw_shown: int = Field(default=3, ge=0, le=100)


class ClientSettings(BaseSettings):
    """Everything ``aistack.Client`` (and the ``aistack`` command) reaches:
    the tuner, the model server, the artifact store, and Kafka's logs (the
    model registry, the prediction log) through ``lineage``."""

    model_config = SettingsConfigDict(env_prefix="AISTACK_CLIENT_", frozen=True, extra="ignore")

    tuner: TunerClientSettings = Field(default_factory=TunerClientSettings)
    model: ModelClientSettings = Field(default_factory=ModelClientSettings)
    artifacts: ArtifactClientSettings = Field(default_factory=ArtifactClientSettings)
    lineage: LineageSettings = Field(default_factory=LineageSettings)

    def artifact_root(self) -> str:
        """The store's root: the setting, else the trainers' default."""
        state_dir = self.lineage.common.state_dir
        return self.artifacts.artifact_root or str(state_dir / "artifacts")

    def features_path(self) -> str:
        """The offline store: the setting (a directory, or a URL on the
        object store), else svc_transform's default."""
        given = self.artifacts.features_path
        return given or str(self.lineage.common.state_dir / "features" / "windows")
