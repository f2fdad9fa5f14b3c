"""svc_score's settings: ``AISTACK_SCORE_*``, ``AISTACK_SPARK_*`` and the shared ones."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from shared.bus.topics import MODELS_READY, PREDICTIONS_BATCH
from shared.settings import ServiceSettings, ServingSettings, SparkSettings


class ScoreSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="AISTACK_SCORE_", frozen=True, extra="ignore")

    spark: SparkSettings = Field(default_factory=SparkSettings)
    models_topic: str = MODELS_READY
    # Which version serves (AISTACK_MODEL_POLICY): scored when none is named.
    serving: ServingSettings = Field(default_factory=ServingSettings)
    # Where `aistack score --publish` puts each scored row.
    predictions_topic: str = PREDICTIONS_BATCH
    # Where the driver and each executor copy and verify the artifact.
    artifact_cache_dir: Path | None = None
    # How long reading the models topic up to its end may take.
    replay_timeout_seconds: float = Field(default=60.0, gt=0, le=3600)

    def cache_dir(self) -> Path:
        return self.artifact_cache_dir or self.common.state_dir / "score-cache"

    def work_dir(self) -> Path:
        """The Spark driver's working directory."""
        return self.common.state_dir / "score" / "spark"
