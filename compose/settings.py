"""Settings of the local launcher (``aistack infra``)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.settings import CommonSettings


class InfraSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AISTACK_INFRA_", frozen=True, extra="ignore")

    host: str = "127.0.0.1"
    kafka_port: int = Field(default=9092, ge=1, le=65535)
    kafka_controller_port: int = Field(default=9093, ge=1, le=65535)
    redis_port: int = Field(default=6379, ge=1, le=65535)
    kafka_heap: str = Field(default="512m", pattern=r"^\d+[mMgG]$")
    start_timeout: float = Field(default=120.0, gt=0)

    common: CommonSettings = Field(default_factory=CommonSettings)
