"""``aistack.Client``: what the ``aistack`` command does, for notebooks and
scripts. Blocking calls (a notebook may run an event loop already)::

    client = aistack.Client()
    study = client.create_study("studies/torch-model.yaml", code="./myproject")
    study = client.wait(study.study_id)             # progress on stdout
    best = client.best_trial(study.study_id)
    prediction = client.predict(best.model_name, x)  # through tritonclient
    print(client.lineage(f"{best.model_name}@{best.model_version}").lines())

Where each service answers comes from the environment (``ClientSettings``:
``AISTACK_TUNER_TARGET``, ``AISTACK_MODEL_TARGET``, ``AISTACK_KAFKA_*``,
``AISTACK_TRAINER_ARTIFACT_ROOT``…), and the arguments override it. Studies
and trials come back as the tuner's ``aistack.v1`` messages, models as
``ModelReady`` events.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

import grpc
from numpy.typing import NDArray

from aistack import models, studies
from aistack.lineage import Node, trace
from aistack.predictions import Prediction, Server, predict
from aistack.settings import ClientSettings
from shared.contracts.aistack.v1 import common_pb2, models_pb2
from shared.contracts.aistack.v1 import tuner_service_pb2 as api
from shared.contracts.aistack.v1.tuner_service_pb2_grpc import TunerServiceStub
from shared.errors import Unavailable
from shared.rpc.client import open_sync_channel
from shared.rpc.errors import raise_for_status
from shared.settings import load_settings


class Client:
    """A connection to the platform: the tuner over gRPC, the model server
    through tritonclient, Kafka's logs and the artifact store."""

    def __init__(
        self,
        tuner: str | None = None,
        model_server: str | None = None,
        *,
        settings: ClientSettings | None = None,
    ) -> None:
        self.settings = settings or load_settings(ClientSettings)
        tuner_settings = self.settings.tuner
        token = tuner_settings.auth_token
        self._channel = open_sync_channel(
            tuner or tuner_settings.target,
            tls_ca_file=tuner_settings.tls_ca_file,
            tls_cert_file=tuner_settings.tls_client_cert_file,
            tls_key_file=tuner_settings.tls_client_key_file,
            token=token.get_secret_value() if token else None,
        )
        self._tuner = TunerServiceStub(self._channel)  # type: ignore[no-untyped-call]
        model = self.settings.model
        self._server = Server(
            model_server or model.target,
            model.auth_token.get_secret_value() if model.auth_token else None,
            model.tls_ca_file,
            model.tls_client_cert_file,
            model.tls_client_key_file,
        )

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- studies ----

    def create_study(self, spec: studies.Spec, *, code: str | Path | None = None) -> api.Study:
        """Create a study from a spec (a StudySpec, a mapping, a YAML or JSON
        file or text); with ``code``, that directory is shipped with it (see
        ``ship_code``). Creating the same spec again returns the study."""
        message = studies.spec_of(spec)
        if code is not None:
            message = studies.with_code(message, self.ship_code(Path(code)))
        response = self._call(self._tuner.CreateStudy, api.CreateStudyRequest(spec=message))
        study: api.Study = response.study
        return study

    def ship_code(self, directory: Path) -> common_pb2.CodePackage:
        """Pack ``directory`` and store it in the artifact store under its
        sha256, for a study's ``task.code``."""
        return studies.ship_code(directory, self.settings.artifact_root())

    def study(self, study_id: str) -> api.Study:
        response = self._call(self._tuner.GetStudy, api.GetStudyRequest(study_id=study_id))
        study: api.Study = response.study
        return study

    def trials(self, study_id: str) -> list[api.Trial]:
        response = self._call(self._tuner.ListTrials, api.ListTrialsRequest(study_id=study_id))
        return list(response.trials)

    def best_trial(self, study_id: str) -> api.Trial:
        """The study's best completed trial; NotFound before there is one."""
        request = api.GetBestTrialRequest(study_id=study_id)
        trial: api.Trial = self._call(self._tuner.GetBestTrial, request).trial
        return trial

    def stop(self, study_id: str) -> api.Study:
        response = self._call(self._tuner.StopStudy, api.StopStudyRequest(study_id=study_id))
        study: api.Study = response.study
        return study

    def wait(
        self,
        study_id: str,
        *,
        progress: bool | TextIO = True,
        timeout: float | None = None,
    ) -> api.Study:
        """Follow the study until it ends (completed, stopped or failed), a
        progress line per change on ``progress`` (stdout for True); returns
        the study as it ended. Unavailable when ``timeout`` passes first."""
        out: TextIO | None = sys.stdout if progress is True else (progress or None)
        study = self.study(study_id)
        maximize = study.spec.objective.direction == common_pb2.DIRECTION_MAXIMIZE
        lines = studies.Progress(study.spec.budget.max_trials, maximize)
        deadline = None if timeout is None else time.monotonic() + timeout
        stream = self._tuner.WatchStudy(
            api.WatchStudyRequest(study_id=study_id),
            timeout=None if deadline is None else max(0.1, deadline - time.monotonic()),
        )
        try:
            for update in stream:
                line = lines.update(update.trial)
                if out is not None and line is not None:
                    out.write(line + "\n")
                    out.flush()
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise Unavailable(f"study {study_id} did not end within {timeout} s") from None
            raise_for_status(error)
        ended = self.study(study_id)
        if out is not None:
            out.write(studies.describe_study(ended, self.trials(study_id)) + "\n")
        return ended

    # ---- models ----

    def model(self, name: str, version: str = "") -> models_pb2.ModelReady:
        """A version's registry entry (for "", the one the model server serves)."""
        from shared import model_registry

        lineage = self.settings.lineage
        registry = model_registry.read(lineage.kafka, lineage.models_topic, lineage.timeout_seconds)
        return registry.version(name, version, lineage.serving.policy)

    def fetch_model(self, name: str, version: str = "", *, into: str | Path) -> Path:
        """A verified copy of a version's artifact in ``into``; its directory."""
        return models.fetch(self.settings, name, version, Path(into))

    def register_model(
        self,
        name: str,
        artifact: str | Path,
        **details: Any,
    ) -> models_pb2.ModelReady:
        """Register a model trained elsewhere as ``name``'s next version
        (``models.Registration``'s fields as keyword arguments)."""
        return models.register(
            self.settings, models.Registration(name=name, artifact=Path(artifact), **details)
        )

    def predict(
        self,
        model: str,
        inputs: NDArray[Any] | Mapping[str, NDArray[Any]] | None = None,
        *,
        version: str = "",
        entity: str | None = None,
        feature: str = "",
        open_window: bool = False,
    ) -> Prediction:
        """One prediction from the model server (``aistack.predictions``)."""
        return predict(
            self._server,
            model,
            inputs,
            version=version,
            entity=entity,
            feature=feature,
            open_window=open_window,
        )

    def lineage(self, target: str) -> Node:
        """A logged prediction (its request id) or ``MODEL@VERSION`` walked
        back to the raw records under it; ``.lines()`` draws it."""
        return trace(self.settings.lineage, target)

    # ---- inside ----

    def _call(self, method: Any, request: Any) -> Any:
        try:
            return method(request)
        except grpc.RpcError as error:
            raise_for_status(error)
            raise  # raise_for_status always raises
