"""The start every service's ``python -m`` shares (``shared.service_main``):
a bad setting or a failure is one line and an exit status, SIGTERM sets the
stop event."""

from __future__ import annotations

import os
import signal

import pytest
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from shared.errors import ConfigError, Unavailable
from shared.service_main import run, stop_on_signals
from shared.settings import ServiceSettings


class _Settings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="AISTACK_MAINTEST_", frozen=True, extra="ignore")

    port: int = Field(default=1, ge=1)


def test_the_service_runs_on_its_settings_and_its_status_is_the_exit_status() -> None:
    assert run("svc_test", _Settings, lambda settings: settings.port + 6) == 7


def test_a_bad_setting_is_one_line_and_status_2_before_the_service_starts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AISTACK_MAINTEST_PORT", "0")
    started = []
    assert run("svc_test", _Settings, started.append) == 2  # type: ignore[arg-type]
    assert started == []
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("svc_test: bad setting AISTACK_MAINTEST_PORT:")


@pytest.mark.parametrize(
    ("error", "status"),
    [(ConfigError("a setting only it checks"), 2), (Unavailable("no broker"), 1)],
)
def test_what_stops_the_service_is_one_line_and_its_status(
    error: Exception, status: int, capsys: pytest.CaptureFixture[str]
) -> None:
    def serve(settings: _Settings) -> int:
        raise error

    assert run("svc_test", _Settings, serve) == status
    assert capsys.readouterr().err.splitlines() == [f"svc_test: {error}"]


def test_sigterm_sets_the_stop_event() -> None:
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        stopping = stop_on_signals()
        assert not stopping.is_set()
        os.kill(os.getpid(), signal.SIGTERM)
        assert stopping.wait(5)
    finally:
        signal.signal(signal.SIGTERM, before[0])
        signal.signal(signal.SIGINT, before[1])
