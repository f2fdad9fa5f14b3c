"""``aistack study`` finds svc_tuner through its flags, else TunerClientSettings;
``study create`` takes its spec as SPEC or ``-f``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from aistack import cli
from aistack.cli import study as study_cli
from aistack.cli.study import StudyCommand, TunerConnection, TunerFlags, tuner_connection
from aistack.settings import TunerClientSettings
from shared.contracts.aistack.v1 import tuner_service_pb2 as api
from shared.settings import load_settings


def flags(tuner: str | None = None, ca: str | None = None) -> TunerFlags:
    return TunerFlags(tuner, ca)


@pytest.fixture(autouse=True)
def no_tuner_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "AISTACK_TUNER_TARGET",
        "AISTACK_TUNER_TLS_CA_FILE",
        "AISTACK_TUNER_TLS_CLIENT_CERT_FILE",
        "AISTACK_TUNER_TLS_CLIENT_KEY_FILE",
        "AISTACK_TUNER_AUTH_TOKEN",
    ):
        monkeypatch.delenv(name, raising=False)


def test_defaults_reach_the_local_tuner_in_the_clear() -> None:
    settings = load_settings(TunerClientSettings)
    assert tuner_connection(flags(), settings) == TunerConnection("localhost:50051", None, None)


def test_the_environment_configures_the_client(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AISTACK_TUNER_TARGET", "tuner.internal:443")
    monkeypatch.setenv("AISTACK_TUNER_TLS_CA_FILE", "/etc/aistack/ca.pem")
    monkeypatch.setenv("AISTACK_TUNER_AUTH_TOKEN", "s3cret")
    settings = load_settings(TunerClientSettings)
    assert "s3cret" not in repr(settings)
    assert tuner_connection(flags(), settings) == TunerConnection(
        "tuner.internal:443", Path("/etc/aistack/ca.pem"), "s3cret"
    )


def test_a_client_certificate_is_presented_for_mutual_tls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AISTACK_TUNER_TLS_CA_FILE", "/etc/aistack/ca.pem")
    monkeypatch.setenv("AISTACK_TUNER_TLS_CLIENT_CERT_FILE", "/etc/aistack/me.pem")
    monkeypatch.setenv("AISTACK_TUNER_TLS_CLIENT_KEY_FILE", "/etc/aistack/me.key")
    connection = tuner_connection(flags(), load_settings(TunerClientSettings))
    assert connection.tls_cert_file == Path("/etc/aistack/me.pem")
    assert connection.tls_key_file == Path("/etc/aistack/me.key")


def test_flags_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AISTACK_TUNER_TARGET", "tuner.internal:443")
    monkeypatch.setenv("AISTACK_TUNER_TLS_CA_FILE", "/etc/aistack/ca.pem")
    settings = load_settings(TunerClientSettings)
    connection = tuner_connection(flags("127.0.0.1:1", "/tmp/other-ca.pem"), settings)
    assert connection == TunerConnection("127.0.0.1:1", Path("/tmp/other-ca.pem"), None)


def test_empty_variables_are_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AISTACK_TUNER_TARGET", "")
    monkeypatch.setenv("AISTACK_TUNER_TLS_CA_FILE", "")
    monkeypatch.setenv("AISTACK_TUNER_AUTH_TOKEN", "")
    settings = load_settings(TunerClientSettings)
    assert tuner_connection(flags(), settings) == TunerConnection("localhost:50051", None, None)


def test_the_forecast_example_opts_in_to_retuning_on_drift() -> None:
    from aistack.studies import load_spec
    from svc_tuner import spec as specs

    root = Path(__file__).resolve().parents[2]
    spec = load_spec((root / "examples/studies/forecast.yaml").read_text())
    specs.validate(spec)
    assert (spec.retune.on_drift, spec.retune.max_trials, spec.retune.warm_trials) == (True, 4, 0)


def test_a_replay_prints_a_line_per_trial_and_the_verdict() -> None:
    from aistack.studies import describe_replay
    from shared.contracts.aistack.v1 import common_pb2
    from shared.contracts.aistack.v1 import tuner_service_pb2 as api

    def value(x: float) -> common_pb2.ParamValue:
        return common_pb2.ParamValue(float_value=x)

    same = api.ReplayedTrial(
        number=0, logged_params={"x": value(0.5)}, replayed_params={"x": value(0.5)},
        matches=True, state=api.TRIAL_STATE_COMPLETED, enqueued=True,
    )  # fmt: skip
    other = api.ReplayedTrial(
        number=1, logged_params={"x": value(0.25)}, replayed_params={"x": value(0.75)},
        matches=False, state=api.TRIAL_STATE_PRUNED,
    )  # fmt: skip
    replayed = api.ReplayStudyResponse(study_id="s", trials=[same, other], identical=False)

    assert describe_replay(replayed) == [
        "trial 0 (completed, enqueued): logged = replayed: x=0.5",
        "trial 1 (pruned, sampled): logged x=0.25 != replayed x=0.75",
        "study s: replay differs: trials 1 proposed otherwise than logged",
    ]


def test_a_failed_study_says_why_and_names_each_failed_trial_with_its_traceback() -> None:
    from aistack.studies import describe_study
    from shared.contracts.aistack.v1 import tuner_service_pb2 as api

    study = api.Study(
        study_id="s",
        state=api.STUDY_STATE_FAILED,
        error="trial 0: attempt 1: user_code_import: cannot import 'x.y:z'",
        trial_counts={"failed": 1, "completed": 1},
    )
    failed = api.Trial(
        number=0,
        state=api.TRIAL_STATE_QUARANTINED,
        errors=["attempt 1: user_code_error: the training loop raised ValueError: bad"],
        traceback='Traceback (most recent call last):\n  File "loop.py", line 3\nValueError: bad',
    )
    fine = api.Trial(number=1, state=api.TRIAL_STATE_COMPLETED, model_name="m", model_version="2")
    fine.value = 0.5
    text = describe_study(study, [failed, fine])
    lines = text.splitlines()
    assert lines[0] == "study s: STUDY_STATE_FAILED; completed 1, failed 1"
    assert lines[1] == "failed: trial 0: attempt 1: user_code_import: cannot import 'x.y:z'"
    assert "failed trials:" in lines
    assert "    attempt 1: user_code_error: the training loop raised ValueError: bad" in text
    assert '        File "loop.py", line 3' in text and text.endswith("ValueError: bad")
    assert "trial 1" not in text.split("failed trials:")[1]


def test_a_watched_study_prints_a_line_per_change_of_its_trials_not_per_epoch() -> None:
    from aistack.studies import Progress
    from shared.contracts.aistack.v1 import tuner_service_pb2 as api

    progress = Progress(total=2, maximize=False)
    running = api.Trial(number=0, state=api.TRIAL_STATE_RUNNING)
    assert progress.update(api.Trial(number=0, state=api.TRIAL_STATE_REQUESTED)) is not None
    assert progress.update(running) is not None
    # Each epoch's intermediate value is an update of the same running trial.
    assert progress.update(running) is None and progress.update(running) is None
    done = api.Trial(number=0, state=api.TRIAL_STATE_COMPLETED)
    done.value = 0.25
    line = progress.update(done)
    assert line is not None and line.endswith(
        "completed 1  pruned 0  failed 0  quarantined 0  best 0.25 (trial 0)"
    )
    assert line.startswith("[############............] 1/2")


def parsed(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> tuple[StudyCommand, TunerFlags]:
    """What ``aistack <argv>`` asks the tuner, parsed by the real command line."""
    seen: list[tuple[StudyCommand, TunerFlags]] = []

    def run(command: StudyCommand, flags: TunerFlags) -> int:
        seen.append((command, flags))
        return 0

    monkeypatch.setattr(study_cli, "run", run)
    assert cli.main(argv) == 0
    (asked,) = seen
    return asked


class RecordingTuner:
    """Stands in for TunerServiceStub: records the spec a study is created with."""

    def __init__(self) -> None:
        self.requests: list[api.CreateStudyRequest] = []

    async def CreateStudy(self, request: api.CreateStudyRequest) -> api.CreateStudyResponse:
        self.requests.append(request)
        return api.CreateStudyResponse(study=api.Study(study_id="s-1"), created=True)


@pytest.mark.parametrize(
    "argv",
    [["study", "create", "SPEC_PATH"], ["study", "create", "-f", "SPEC_PATH"]],
    ids=["positional", "dash-f"],
)
def test_create_reads_the_spec_given_as_an_argument_or_with_dash_f(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: from-the-file\n")
    command, _ = parsed(monkeypatch, [str(spec) if a == "SPEC_PATH" else a for a in argv])
    tuner = RecordingTuner()
    stub: Any = tuner
    assert asyncio.run(study_cli.dispatch(stub, command)) == 0
    assert [request.spec.name for request in tuner.requests] == ["from-the-file"]
    assert capsys.readouterr().out == "study s-1 created\n"


def test_create_takes_code_after_a_positional_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    command, _ = parsed(monkeypatch, ["study", "create", "spec.yaml", "--code", "./myproject"])
    assert (command.spec, command.code) == ("spec.yaml", "./myproject")


def test_the_tuner_flags_come_before_the_study_command(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["study", "--tuner", "127.0.0.1:1", "--ca", "ca.pem", "show", "s-1"]
    command, flags = parsed(monkeypatch, argv)
    assert (command, flags) == (StudyCommand("show", "s-1"), TunerFlags("127.0.0.1:1", "ca.pem"))


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["study", "create"], "one of the arguments SPEC -f/--file is required"),
        (["study", "create", "a.yaml", "-f", "b.yaml"], "argument -f/--file: not allowed with"),
        (["study", "create", "-f", "b.yaml", "a.yaml"], "argument SPEC: not allowed with"),
    ],
    ids=["neither", "both", "both-reversed"],
)
def test_create_refuses_no_spec_or_two_in_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], error: str
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith("aistack study create: error: ")
    assert error in err[-1]
