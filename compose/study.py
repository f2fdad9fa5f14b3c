"""``aistack study``: create, watch, inspect, stop and replay tuning studies on
svc_tuner.

A client of ``aistack.v1.TunerService`` over gRPC; the tuner validates specs
(an invalid one comes back as INVALID_ARGUMENT naming the field). What a spec
is and how a study reads in words are ``aistack.studies``'s, shared with the
Python client.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple, TextIO

import grpc
from google.protobuf import json_format

from aistack.settings import ClientSettings, TunerClientSettings
from aistack.studies import (
    Progress,
    describe_replay,
    describe_study,
    describe_trial,
    load_spec,
    ship_code,
    with_code,
)
from shared.contracts.aistack.v1 import common_pb2, tuning_pb2
from shared.contracts.aistack.v1 import tuner_service_pb2 as api
from shared.contracts.aistack.v1.tuner_service_pb2_grpc import TunerServiceStub
from shared.rpc.client import open_channel
from shared.settings import load_settings

BAR_WIDTH = 24


def cross_validation_spec(
    base: tuning_pb2.StudySpec, name: str, params: Mapping[str, common_pb2.ParamValue], folds: int
) -> tuning_pb2.StudySpec:
    """A study that cross-validates one configuration of ``base``'s model:
    ``params`` (the trainer's defaults for the rest), ``base``'s task and
    epochs; a grid over the folds (``cv_fold``), one trial each, so the
    trainers share it; every trainer splits the data into the same
    stratified folds (``task.options.cv_folds``) for any configuration."""
    spec = tuning_pb2.StudySpec()
    spec.CopyFrom(base)
    spec.name = name
    del spec.params[:]
    for param, value in sorted(params.items()):
        spec.params.add(name=param).categorical.choices.add().CopyFrom(value)
    choices = spec.params.add(name="cv_fold").categorical.choices
    for fold in range(folds):
        choices.add().int_value = fold
    spec.sampler.Clear()
    spec.sampler.kind = tuning_pb2.SAMPLER_KIND_GRID
    spec.pruner.Clear()
    spec.pruner.kind = tuning_pb2.PRUNER_KIND_NONE
    spec.budget.max_trials = folds
    spec.budget.time_limit.FromSeconds(1800)
    spec.refit = False
    spec.task.options["cv_folds"] = str(folds)
    return spec


def fold_errors(trials: Iterable[api.Trial], folds: int) -> list[float]:
    """Each fold's error, from a cross-validation study's completed trials
    (``fold_<i>_error``); KeyError for a fold none of them reports."""
    from compose import kfold

    metrics = {
        name: value
        for trial in trials
        if trial.state == api.TRIAL_STATE_COMPLETED
        for name, value in trial.metrics.items()
    }
    return kfold.fold_errors(metrics, folds)


def add_parser(commands: Any) -> None:
    study = commands.add_parser("study", help="hyperparameter studies on svc_tuner")
    # Their defaults are TunerClientSettings', read when the command runs: a
    # bad AISTACK_TUNER_* then fails `aistack study` alone, naming the variable.
    default_target = TunerClientSettings.model_fields["target"].default
    study.add_argument(
        "--tuner",
        help=f"svc_tuner's address (AISTACK_TUNER_TARGET, default {default_target})",
    )
    study.add_argument("--ca", help="CA file: use TLS (AISTACK_TUNER_TLS_CA_FILE)")
    actions = study.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="create a study from a YAML or JSON spec")
    # The spec as SPEC or as -f (the older spelling, kept): exactly one, which
    # argparse enforces and names in one line when neither or both are given.
    spec_source = create.add_mutually_exclusive_group(required=True)
    spec_source.add_argument(
        "spec", nargs="?", metavar="SPEC", help="the spec; - for standard input"
    )
    spec_source.add_argument("-f", "--file", help="the same as SPEC")
    create.add_argument(
        "--code",
        metavar="DIR",
        help="ship this directory with the study: packed, stored in the artifact store "
        "(AISTACK_TRAINER_ARTIFACT_ROOT) under its sha256, imported by the trainers",
    )
    create.add_argument("--watch", action="store_true", help="then watch it to the end")
    for name, text in (
        ("watch", "follow a study's trials live until it ends"),
        ("best", "the best trial so far"),
        ("stop", "stop a study: no new trials, running ones told to stop"),
        ("show", "a study's state and trial counts"),
    ):
        action = actions.add_parser(name, help=text)
        action.add_argument("study_id")
    replay = actions.add_parser(
        "replay",
        help="re-run a finished study's proposals from its log and compare them "
        "(exit 1 when they differ)",
    )
    replay.add_argument("study_id")
    replay.add_argument("--json", action="store_true", help="the whole replay as JSON")
    study.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    return asyncio.run(_run(args, load_settings(TunerClientSettings)))


class TunerConnection(NamedTuple):
    target: str
    tls_ca_file: Path | None
    token: str | None
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None


def tuner_connection(args: argparse.Namespace, settings: TunerClientSettings) -> TunerConnection:
    """Where and how to reach svc_tuner: the flags, else the settings."""
    return TunerConnection(
        args.tuner or settings.target,
        Path(args.ca) if args.ca else settings.tls_ca_file,
        settings.auth_token.get_secret_value() if settings.auth_token else None,
        settings.tls_client_cert_file,
        settings.tls_client_key_file,
    )


async def _run(args: argparse.Namespace, settings: TunerClientSettings) -> int:
    connection = tuner_connection(args, settings)
    async with open_channel(
        connection.target,
        tls_ca_file=connection.tls_ca_file,
        tls_cert_file=connection.tls_cert_file,
        tls_key_file=connection.tls_key_file,
        token=connection.token,
    ) as channel:
        stub = TunerServiceStub(channel)  # type: ignore[no-untyped-call]
        try:
            return await _dispatch(stub, args)
        except grpc.aio.AioRpcError as error:
            print(f"aistack study: {error.code().name}: {error.details()}", file=sys.stderr)
            return 1


async def _dispatch(stub: TunerServiceStub, args: argparse.Namespace) -> int:
    if args.action == "create":
        source = args.spec if args.spec is not None else args.file
        text = sys.stdin.read() if source == "-" else Path(source).read_text()
        spec = load_spec(text)
        if args.code:
            package = ship_code(Path(args.code), load_settings(ClientSettings).artifact_root())
            spec = with_code(spec, package)
            print(f"code {package.name}: sha256 {package.sha256}, {package.size_bytes} bytes")
        response = await stub.CreateStudy(api.CreateStudyRequest(spec=spec))
        verb = "created" if response.created else "exists (same spec)"
        print(f"study {response.study.study_id} {verb}")
        if args.watch:
            return await watch(stub, response.study.study_id, sys.stdout)
        return 0
    if args.action == "watch":
        return await watch(stub, args.study_id, sys.stdout)
    if args.action == "best":
        best = await stub.GetBestTrial(api.GetBestTrialRequest(study_id=args.study_id))
        print(describe_trial(best.trial))
        return 0
    if args.action == "replay":
        replayed = await stub.ReplayStudy(api.ReplayStudyRequest(study_id=args.study_id))
        if args.json:
            print(json_format.MessageToJson(replayed, sort_keys=True))
        else:
            print("\n".join(describe_replay(replayed)))
        return 0 if replayed.identical else 1
    if args.action == "stop":
        stopped = await stub.StopStudy(api.StopStudyRequest(study_id=args.study_id))
        print(f"study {args.study_id}: {api.StudyState.Name(stopped.study.state)}")
        return 0
    shown = await stub.GetStudy(api.GetStudyRequest(study_id=args.study_id))
    listed = await stub.ListTrials(api.ListTrialsRequest(study_id=args.study_id))
    print(describe_study(shown.study, listed.trials))
    return 0


async def watch(stub: TunerServiceStub, study_id: str, out: TextIO) -> int:
    """Print a progress line per change until the study ends (redrawn in place on a terminal)."""
    study = (await stub.GetStudy(api.GetStudyRequest(study_id=study_id))).study
    maximize = study.spec.objective.direction == common_pb2.DIRECTION_MAXIMIZE
    lines = Progress(study.spec.budget.max_trials, maximize)
    live = out.isatty()
    state: int = study.state
    async for update in stub.WatchStudy(api.WatchStudyRequest(study_id=study_id)):
        state = update.study_state
        line = lines.update(update.trial)
        if line is not None:
            out.write(("\r" + line) if live else (line + "\n"))
            out.flush()
    if live:
        out.write("\n")
    out.write(f"study {study_id}: {api.StudyState.Name(state)}\n")
    if state == api.STUDY_STATE_FAILED:
        shown = (await stub.GetStudy(api.GetStudyRequest(study_id=study_id))).study
        out.write(f"failed: {shown.error}\n")
        return 1
    return 0
