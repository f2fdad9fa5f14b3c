"""``aistack study``: create, watch, inspect, stop and replay tuning studies on
svc_tuner.

A client of ``aistack.v1.TunerService`` over gRPC; the tuner validates specs
(an invalid one comes back as INVALID_ARGUMENT naming the field). What a spec
is and how a study reads in words are ``aistack.studies``'s, shared with the
Python client.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NamedTuple, TextIO

import typer
from typer.core import TyperCommand

from aistack.cli import terminal
from aistack.settings import TunerClientSettings

if TYPE_CHECKING:
    from aistack.studies import StudyProgress
    from shared.contracts.aistack.v1.tuner_service_pb2_grpc import TunerServiceStub

#: ``--tuner``: where svc_tuner answers, for every command that asks it.
TunerOption = Annotated[
    str | None,
    typer.Option(
        help="svc_tuner's address (AISTACK_TUNER_TARGET, default "
        f"{TunerClientSettings.model_fields['target'].default})"
    ),
]

app = typer.Typer(help="Hyperparameter studies on svc_tuner.", no_args_is_help=True)


class TunerFlags(NamedTuple):
    """``--tuner`` and ``--ca`` as given (None: not given)."""

    tuner: str | None = None
    ca: str | None = None


@app.callback()
def flags(
    ctx: typer.Context,
    tuner: TunerOption = None,
    ca: Annotated[
        str | None, typer.Option(help="CA file: use TLS (AISTACK_TUNER_TLS_CA_FILE)")
    ] = None,
) -> None:
    # The settings are read when a command runs, not here: a bad
    # AISTACK_TUNER_* then fails `aistack study` alone, naming the variable.
    ctx.obj = TunerFlags(tuner, ca)


@dataclass(frozen=True)
class StudyCommand:
    """What one ``aistack study`` command asks the tuner."""

    action: str
    study_id: str = ""
    spec: str = ""  # create: a spec file's path, or - for standard input
    code: str | None = None  # create: a directory to ship with the study
    watch: bool = False  # create: then watch it to the end
    json: bool = False  # replay: the whole replay as JSON


StudyId = Annotated[str, typer.Argument(metavar="STUDY_ID")]


class Refused(typer.BadParameter):
    """A usage error said as it is, without Typer's "Invalid value" prefix."""

    def format_message(self) -> str:
        return self.message


class _TypedArgs(TyperCommand):
    """Keeps the arguments as typed (``ctx.meta["typed"]``): which of two
    spellings of one thing came second is only known from them."""

    # Typer's click is its own (typer._click): its Context is typed loosely here.
    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        ctx.meta["typed"] = list(args)
        return super().parse_args(ctx, args)


def _second(typed: list[str], spec: str) -> str:
    """Of SPEC and -f/--file, the one typed second."""
    file_at = next(
        i for i, arg in enumerate(typed) if arg in ("-f", "--file") or arg.startswith("--file=")
    )
    # The file's own value follows -f or --file, not --file=...
    its_value = file_at + 1 if typed[file_at] in ("-f", "--file") else -1
    spec_at = next((i for i, arg in enumerate(typed) if arg == spec and i != its_value), -1)
    return "SPEC" if spec_at > file_at else "-f/--file"


@app.command(cls=_TypedArgs)
def create(
    ctx: typer.Context,
    spec: Annotated[
        str | None,
        typer.Argument(
            metavar="SPEC",
            help="the spec (YAML or JSON); - for standard input",
        ),
    ] = None,
    file: Annotated[
        str | None,
        typer.Option("-f", "--file", help="the same as SPEC"),
    ] = None,
    code: Annotated[
        str | None,
        typer.Option(
            metavar="DIR",
            help="ship this directory with the study: packed, stored in the artifact store "
            "(AISTACK_TRAINER_ARTIFACT_ROOT) under its sha256, imported by the trainers",
        ),
    ] = None,
    watch: Annotated[bool, typer.Option("--watch", help="then watch it to the end")] = False,
) -> int:
    """Create a study from a YAML or JSON spec."""
    # The spec as SPEC or as -f (the older spelling, kept): exactly one.
    if spec is None and file is None:
        raise Refused("one of the arguments SPEC -f/--file is required", ctx)
    if spec is not None and file is not None:
        second = _second(ctx.meta["typed"], spec)
        first = "SPEC" if second == "-f/--file" else "-f/--file"
        raise Refused(f"argument {second}: not allowed with argument {first}", ctx)
    return run(StudyCommand("create", spec=spec or file or "", code=code, watch=watch), ctx.obj)


@app.command("watch")
def watch_command(ctx: typer.Context, study_id: StudyId) -> int:
    """Follow a study's trials live until it ends."""
    return run(StudyCommand("watch", study_id), ctx.obj)


@app.command()
def best(ctx: typer.Context, study_id: StudyId) -> int:
    """The best trial so far."""
    return run(StudyCommand("best", study_id), ctx.obj)


@app.command()
def stop(ctx: typer.Context, study_id: StudyId) -> int:
    """Stop a study: no new trials, running ones told to stop."""
    return run(StudyCommand("stop", study_id), ctx.obj)


@app.command()
def show(ctx: typer.Context, study_id: StudyId) -> int:
    """A study's state and trial counts."""
    return run(StudyCommand("show", study_id), ctx.obj)


@app.command()
def replay(
    ctx: typer.Context,
    study_id: StudyId,
    json: Annotated[bool, typer.Option("--json", help="the whole replay as JSON")] = False,
) -> int:
    """Re-run a finished study's proposals from its log and compare them (exit 1 when
    they differ)."""
    return run(StudyCommand("replay", study_id, json=json), ctx.obj)


def run(command: StudyCommand, flags: TunerFlags) -> int:
    from shared.settings import load_settings

    connection = tuner_connection(flags, load_settings(TunerClientSettings))
    return asyncio.run(_run(command, connection))


class TunerConnection(NamedTuple):
    target: str
    tls_ca_file: Path | None
    token: str | None
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None


def tuner_connection(flags: TunerFlags, settings: TunerClientSettings) -> TunerConnection:
    """Where and how to reach svc_tuner: the flags, else the settings."""
    return TunerConnection(
        flags.tuner or settings.target,
        Path(flags.ca) if flags.ca else settings.tls_ca_file,
        settings.auth_token.get_secret_value() if settings.auth_token else None,
        settings.tls_client_cert_file,
        settings.tls_client_key_file,
    )


async def _run(command: StudyCommand, connection: TunerConnection) -> int:
    import grpc

    from shared.contracts.aistack.v1.tuner_service_pb2_grpc import TunerServiceStub
    from shared.rpc.client import open_channel

    async with open_channel(
        connection.target,
        tls_ca_file=connection.tls_ca_file,
        tls_cert_file=connection.tls_cert_file,
        tls_key_file=connection.tls_key_file,
        token=connection.token,
    ) as channel:
        stub = TunerServiceStub(channel)  # type: ignore[no-untyped-call]
        try:
            return await dispatch(stub, command)
        except grpc.aio.AioRpcError as error:
            print(f"aistack study: {error.code().name}: {error.details()}", file=sys.stderr)
            return 1


async def dispatch(stub: TunerServiceStub, command: StudyCommand) -> int:
    """Ask the tuner what ``command`` asks; print the answer; the exit status."""
    from google.protobuf import json_format

    from aistack.studies import describe_replay, describe_study, describe_trial
    from shared.contracts.aistack.v1 import tuner_service_pb2 as api

    study_id = command.study_id
    if command.action == "create":
        return await _create(stub, command)
    if command.action == "watch":
        return await watch(stub, study_id, sys.stdout)
    if command.action == "best":
        best = await stub.GetBestTrial(api.GetBestTrialRequest(study_id=study_id))
        print(describe_trial(best.trial))
        return 0
    if command.action == "replay":
        replayed = await stub.ReplayStudy(api.ReplayStudyRequest(study_id=study_id))
        if command.json:
            print(json_format.MessageToJson(replayed, sort_keys=True))
        else:
            print("\n".join(describe_replay(replayed)))
        return 0 if replayed.identical else 1
    if command.action == "stop":
        stopped = await stub.StopStudy(api.StopStudyRequest(study_id=study_id))
        print(f"study {study_id}: {api.StudyState.Name(stopped.study.state)}")
        return 0
    shown = await stub.GetStudy(api.GetStudyRequest(study_id=study_id))
    listed = await stub.ListTrials(api.ListTrialsRequest(study_id=study_id))
    print(describe_study(shown.study, listed.trials))
    return 0


async def _create(stub: TunerServiceStub, command: StudyCommand) -> int:
    from aistack.settings import ClientSettings
    from aistack.studies import load_spec, ship_code, with_code
    from shared.contracts.aistack.v1 import tuner_service_pb2 as api
    from shared.settings import load_settings

    text = sys.stdin.read() if command.spec == "-" else Path(command.spec).read_text()
    spec = load_spec(text)
    if command.code:
        package = ship_code(Path(command.code), load_settings(ClientSettings).artifact_root())
        spec = with_code(spec, package)
        print(f"code {package.name}: sha256 {package.sha256}, {package.size_bytes} bytes")
    response = await stub.CreateStudy(api.CreateStudyRequest(spec=spec))
    verb = "created" if response.created else "exists (same spec)"
    print(f"study {response.study.study_id} {verb}")
    if command.watch:
        return await watch(stub, response.study.study_id, sys.stdout)
    return 0


async def follow(
    stub: TunerServiceStub, study_id: str, changed: Callable[[StudyProgress], object]
) -> int:
    """Until the study ends: ``changed`` with its progress each time a trial's
    state (or the best) changes. The state it ended in (``api.StudyState``)."""
    from aistack.studies import Progress
    from shared.contracts.aistack.v1 import common_pb2
    from shared.contracts.aistack.v1 import tuner_service_pb2 as api

    study = (await stub.GetStudy(api.GetStudyRequest(study_id=study_id))).study
    maximize = study.spec.objective.direction == common_pb2.DIRECTION_MAXIMIZE
    progress = Progress(study.spec.budget.max_trials, maximize)
    state: int = study.state
    async for update in stub.WatchStudy(api.WatchStudyRequest(study_id=study_id)):
        state = update.study_state
        if progress.update(update.trial) is not None:
            changed(progress.now)
    return state


async def watch(stub: TunerServiceStub, study_id: str, out: TextIO) -> int:
    """A study's progress until it ends: a Rich progress bar on a terminal, a
    line per change otherwise; then its end state (exit status 1: failed)."""
    from shared.contracts.aistack.v1 import tuner_service_pb2 as api

    if out.isatty():
        with terminal.study_bar(out) as bar:
            state = await follow(stub, study_id, bar)
    else:

        def line(progress: StudyProgress) -> None:
            out.write(progress.line() + "\n")
            out.flush()

        state = await follow(stub, study_id, line)
    out.write(f"study {study_id}: {api.StudyState.Name(state)}\n")
    if state == api.STUDY_STATE_FAILED:
        shown = (await stub.GetStudy(api.GetStudyRequest(study_id=study_id))).study
        out.write(f"failed: {shown.error}\n")
        return 1
    return 0
