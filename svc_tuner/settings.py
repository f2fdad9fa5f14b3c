"""svc_tuner's settings: ``AISTACK_TUNER_*`` and the shared ones."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from shared.bus.topics import (
    EVENTS_DLQ,
    MONITORING_DRIFT,
    TOPICS_BY_NAME,
    TUNING_CONTROL,
    TUNING_REPORTS,
    TUNING_RESULTS,
    TUNING_TRIALS,
    TopicSpec,
)
from shared.rpc.settings import GrpcServerSettings
from shared.settings import ServingSettings


class TunerSettings(GrpcServerSettings):
    model_config = SettingsConfigDict(env_prefix="AISTACK_TUNER_", frozen=True, extra="ignore")

    grpc_address: str = "0.0.0.0:50051"
    trials_topic: str = TUNING_TRIALS
    reports_topic: str = TUNING_REPORTS
    control_topic: str = TUNING_CONTROL
    results_topic: str = TUNING_RESULTS
    dlq_topic: str = EVENTS_DLQ
    # The drift monitor's findings: re-tunes start from them.
    drift_topic: str = MONITORING_DRIFT
    # On the reports topic; the drift topic's group is this plus ".drift".
    group_id: str = "svc_tuner"
    # The trainers' consumer group (their AISTACK_TRAINER_GROUP_ID): whose
    # partition of the trials topic is whose, so that each request goes to a
    # free trainer (svc_tuner.dispatch).
    trainer_group_id: str = "svc_trainer"
    # Key prefix of Optuna's journal in Redis (one per tuner deployment).
    storage_prefix: str = Field(default="aistack:tuner", min_length=1)
    # How often studies are topped up and checked for lost trials.
    tick_seconds: float = Field(default=1.0, gt=0, le=60)
    metrics_port: int = Field(default=9104, ge=0, le=65535)
    # optuna-dashboard on this journal (python -m svc_tuner.dashboard).
    dashboard_host: str = "127.0.0.1"
    dashboard_port: int = Field(default=8080, ge=1, le=65535)
    # Which version serves (AISTACK_MODEL_POLICY, the model server's): under
    # "live" a re-tune's winner is reported shadowed, not promoted.
    serving: ServingSettings = Field(default_factory=ServingSettings)

    def topic_specs(self) -> list[TopicSpec]:
        return topic_specs(
            trials=self.trials_topic,
            reports=self.reports_topic,
            control=self.control_topic,
            results=self.results_topic,
            dlq=self.dlq_topic,
            drift=self.drift_topic,
        )

    @property
    def drift_group_id(self) -> str:
        return f"{self.group_id}.drift"


def topic_specs(
    *,
    trials: str,
    reports: str,
    control: str,
    results: str,
    dlq: str,
    drift: str = MONITORING_DRIFT,
) -> list[TopicSpec]:
    """The tuner's topics under the given names, each with its standard spec."""
    return [
        TOPICS_BY_NAME[TUNING_TRIALS].named(trials),
        TOPICS_BY_NAME[TUNING_REPORTS].named(reports),
        TOPICS_BY_NAME[TUNING_CONTROL].named(control),
        TOPICS_BY_NAME[TUNING_RESULTS].named(results),
        TOPICS_BY_NAME[EVENTS_DLQ].named(dlq),
        TOPICS_BY_NAME[MONITORING_DRIFT].named(drift),
    ]
