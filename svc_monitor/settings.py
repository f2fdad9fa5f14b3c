"""svc_monitor's settings: ``AISTACK_MONITOR_*`` and the shared ones."""

from __future__ import annotations

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from shared.bus.topics import (
    EVENTS_DLQ,
    FEATURES_WINDOWS,
    LABELS,
    MODELS_DECISIONS,
    MODELS_READY,
    MONITORING_DRIFT,
    MONITORING_PERFORMANCE,
    PREDICTIONS,
    PREDICTIONS_JOINED,
    TOPICS_BY_NAME,
    TopicSpec,
)
from shared.settings import ServiceSettings, ServingSettings
from svc_monitor.champion import Rule
from svc_monitor.drift import Thresholds


class MonitorSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="AISTACK_MONITOR_", frozen=True, extra="ignore")

    models_topic: str = MODELS_READY
    # Which version serves (AISTACK_MODEL_POLICY, the model server's): the one watched.
    serving: ServingSettings = Field(default_factory=ServingSettings)
    windows_topic: str = FEATURES_WINDOWS
    drift_topic: str = MONITORING_DRIFT
    dlq_topic: str = EVENTS_DLQ
    # A statistic drifts when its PSI and its KS D pass these, and D passes
    # the KS test's critical value at alpha.
    psi_threshold: float = Field(default=0.25, gt=0, le=100)
    ks_threshold: float = Field(default=0.2, gt=0, lt=1)
    alpha: float = Field(default=0.001, gt=0, lt=1)
    # Fewer windows of a feature than this are not judged.
    min_windows: int = Field(default=20, ge=2, le=1_000_000)
    # The sliding horizon: a feature's latest this many windows.
    horizon_windows: int = Field(default=120, ge=2, le=1_000_000)
    # Records per partition of the windows topic read back on start to refill
    # the horizons (0: start empty and wait for new windows).
    rebuild_records: int = Field(default=1000, ge=0, le=10_000_000)
    # The joiner: logged predictions in, their truths (windows, users' labels)
    # in, each prediction settled once on the joined topic, each version's
    # live error on the performance topic.
    predictions_topic: str = PREDICTIONS
    labels_topic: str = LABELS
    joined_topic: str = PREDICTIONS_JOINED
    performance_topic: str = MONITORING_PERFORMANCE
    # Event time a truth may trail the latest of its stream and still be
    # joined (windows by their end, labels by their event time); a prediction
    # whose truth is older than that is settled as expired.
    window_lateness_seconds: float = Field(default=120.0, ge=0, le=7 * 86400)
    label_lateness_seconds: float = Field(default=3600.0, ge=0, le=30 * 86400)
    # How far back (by record time) the predictions, windows and labels are
    # replayed at start to rebuild what waits: more than a prediction waits.
    join_lookback_seconds: float = Field(default=7200.0, gt=0, le=30 * 86400)
    # A version's live error covers its latest this many joined predictions,
    # published at most once per interval per version.
    performance_horizon: int = Field(default=1000, ge=1, le=10_000_000)
    performance_interval_seconds: float = Field(default=10.0, ge=0, le=86400)
    # The champion rule on live traffic (svc_monitor.champion): a challenger
    # is judged against the champion at every multiple of this many requests
    # both served, by a one-sided paired test at champion_alpha; a champion's
    # live error past its validation value by degraded_margin (a share of it)
    # is degraded. Decisions go to decisions_topic; a promotion or rollback
    # also republishes the chosen version on models_topic.
    decisions_topic: str = MODELS_DECISIONS
    champion_min_pairs: int = Field(default=200, ge=2, le=10_000_000)
    champion_alpha: float = Field(default=0.01, gt=0, lt=1)
    degraded_margin: float = Field(default=0.5, ge=0, le=1000)
    # How long start-up may take to read the models and drift topics.
    replay_timeout_seconds: float = Field(default=60.0, gt=0, le=3600)
    metrics_port: int = Field(default=9107, ge=0, le=65535)

    @model_validator(mode="after")
    def _check_horizon(self) -> MonitorSettings:
        if self.min_windows > self.horizon_windows:
            raise ValueError(
                f"AISTACK_MONITOR_MIN_WINDOWS ({self.min_windows}) exceeds "
                f"AISTACK_MONITOR_HORIZON_WINDOWS ({self.horizon_windows}): nothing "
                "would ever be judged"
            )
        return self

    def thresholds(self) -> Thresholds:
        return Thresholds(
            psi=self.psi_threshold,
            ks=self.ks_threshold,
            alpha=self.alpha,
            min_windows=self.min_windows,
        )

    def rule(self) -> Rule:
        return Rule(
            min_pairs=self.champion_min_pairs,
            alpha=self.champion_alpha,
            margin=self.degraded_margin,
        )

    def topic_specs(self) -> list[TopicSpec]:
        return [
            TOPICS_BY_NAME[MODELS_READY].named(self.models_topic),
            TOPICS_BY_NAME[FEATURES_WINDOWS].named(self.windows_topic),
            TOPICS_BY_NAME[MONITORING_DRIFT].named(self.drift_topic),
            TOPICS_BY_NAME[PREDICTIONS].named(self.predictions_topic),
            TOPICS_BY_NAME[LABELS].named(self.labels_topic),
            TOPICS_BY_NAME[PREDICTIONS_JOINED].named(self.joined_topic),
            TOPICS_BY_NAME[MONITORING_PERFORMANCE].named(self.performance_topic),
            TOPICS_BY_NAME[MODELS_DECISIONS].named(self.decisions_topic),
            TOPICS_BY_NAME[EVENTS_DLQ].named(self.dlq_topic),
        ]
