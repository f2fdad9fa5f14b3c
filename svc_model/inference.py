"""The inference core: everything the Open Inference Protocol asks of a
server, without gRPC (the servicer is a thin adapter over this).

Errors are raised as aistack errors (NotFound, InvalidArgument,
ResourceExhausted, …); the shared server maps them to status codes.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from shared import model_registry
from shared.bus.envelope import new_event_id
from shared.contracts.aistack.v1 import models_pb2
from shared.contracts.aistack.v1.features_pb2 import FeatureWindow
from shared.contracts.aistack.v1.predictions_pb2 import (
    PREDICTION_ROLE_CHAMPION,
    PREDICTION_ROLE_NAMED,
    PREDICTION_ROLE_SHADOW,
)
from shared.contracts.inference import grpc_predict_v2_pb2 as pb
from shared.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from shared.feature_store import FEATURE_LABEL
from shared.log import get_logger
from shared.model_loading import ArtifactRejected, TensorSig
from shared.objective import version_number
from shared.rpc.errors import status_for
from svc_model import features as entity
from svc_model.features import OnlineFeatures, feature_row
from svc_model.loading import Loaded, Loader
from svc_model.metrics import ModelMetrics
from svc_model.prediction_log import Prediction, PredictionLog
from svc_model.repository import IndexEntry, Repository, Served
from svc_model.settings import ModelSettings
from svc_model.tensors import batch_rows, decode_inputs, encode_outputs

log = get_logger("svc_model")
# Which requests are shadowed: a generator of its own, so that a caller's
# random.seed() (a test's, an embedding program's) neither decides nor moves.
_shadow_draw = random.Random().random

SERVER_NAME = "aistack"
SERVER_VERSION = "0.1.0"
EXTENSIONS = ("model_repository", "binary_tensor_data", "parameters", "entity_features")
UNKNOWN_MODEL_LABEL = "_unknown"
#: A second request in flight marks the server busy for this long: a lone
#: request then goes through its version's batcher (what arrives while the
#: model runs merges with it), not onto the event loop (``Batcher``'s
#: ``lone_inline``). Under load some request is nearly always in flight.
BUSY_S = 1.0
#: A challenger's shadow runs wait for the next gate of this period and go
#: to its batcher together, so that they merge as the champion's requests
#: do: one at a time, each a one-row execution, they took the cores the
#: champion's batches needed (bench.serving's shadow_cost). Nobody waits on
#: a shadow.
SHADOW_GATHER_S = 0.05
#: The response parameter that carries the request id (the client's, or the
#: one the server assigned): the id the prediction log knows the request by.
REQUEST_ID_PARAMETER = "request_id"

Rejected = Callable[[models_pb2.ModelReady, ArtifactRejected], None]


class InferenceCore:
    def __init__(
        self,
        settings: ModelSettings,
        loader: Loader,
        loading_executor: Executor,
        metrics: ModelMetrics,
        features: OnlineFeatures | None = None,
        prediction_log: PredictionLog | None = None,
    ) -> None:
        self.settings = settings
        # Challengers run only where their predictions can be judged: in the log.
        self._shadowing = prediction_log is not None and settings.shadow_fraction > 0
        self.repository = Repository(
            settings.serving.policy,
            settings.keep_versions,
            settings.serving.challengers if self._shadowing else 0,
        )
        self._loader = loader
        self._loading = loading_executor
        self._metrics = metrics
        self._features = features
        self._prediction_log = prediction_log
        self._in_flight = 0
        self._busy_until = 0.0
        self._request_counters: dict[tuple[str, str], Any] = {}
        self._latencies: dict[str, Any] = {}
        self._shadows_in_flight = 0
        # The shadow runs under way: held so that none is collected mid-run.
        self._shadow_tasks: set[asyncio.Task[None]] = set()
        # Each challenger's next gate (SHADOW_GATHER_S), by model and version.
        self._shadow_gates: dict[tuple[str, int], asyncio.Future[None]] = {}
        self.replayed = asyncio.Event()
        self.on_rejected: Rejected = lambda event, error: None

    # ---- health ----

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        return self.replayed.is_set()

    def model_ready(self, name: str, version: str = "") -> bool:
        if name not in self.repository.names():
            raise NotFound(f"unknown model {name!r}")
        try:
            self.repository.resolve(name, version)
        except NotFound:
            return False
        return True

    # ---- models from the bus ----

    async def replay(self, events: Iterable[models_pb2.ModelReady]) -> None:
        """Rebuild the repository from the whole topic: learn every version,
        then load only those the policy keeps (the champion and the newest)."""
        names: set[str] = set()
        for event in events:
            if self._acceptable(event):
                self.repository.know(event)
                names.add(event.model_name)
        for name in sorted(names):
            await asyncio.gather(*(self._load(e) for e in self.repository.wanted(name)))
        self.replayed.set()
        log.info("models.replayed", models=len(names), index=len(self.repository.index()))

    async def offer(self, event: models_pb2.ModelReady) -> None:
        """A model-ready event that arrived after the replay."""
        if not self._acceptable(event):
            return
        promoted = self.repository.know(event)
        try:
            current = self.repository.resolve(event.model_name, event.version)
        except NotFound:
            current = None
        if current is not None and current.event.sha256 == event.sha256:
            if promoted:
                self._serving_changed(event.model_name)
            return  # the same bytes: a redelivery, or a decision's labels
        if self.repository.is_unloaded(event.model_name):
            return  # loads again on RepositoryModelLoad
        await self._load(event)

    def _acceptable(self, event: models_pb2.ModelReady) -> bool:
        reason = model_registry.invalid(event)
        if reason:
            self._reject(event, ArtifactRejected(reason, reason="bad_event"))
            return False
        return True

    async def _load(self, event: models_pb2.ModelReady) -> bool:
        loop = asyncio.get_running_loop()
        try:
            served = await loop.run_in_executor(self._loading, self._loader.load, event)
        except ArtifactRejected as error:
            self.repository.failed(event.model_name, event.version, error.reason)
            self._reject(event, error)
            return False
        self._install(served)
        return True

    def _install(self, served: Served) -> None:
        change = self.repository.install(served)
        name = served.name
        self._metrics.loads.labels(name).inc()
        self._metrics.loaded_versions.labels(name).set(len(self.repository.loaded_versions(name)))
        champion = self.repository.champion(name)
        if champion is not None:
            self._metrics.serving_version.labels(name).set(champion.version)
        log.info(
            "model.installed",
            model=name,
            version=served.version,
            promoted=change.promoted,
            serving=champion.version if champion else None,
            evicted=[s.version for s in change.evicted],
        )

    def _serving_changed(self, name: str) -> None:
        champion = self.repository.champion(name)
        if champion is not None:
            self._metrics.serving_version.labels(name).set(champion.version)
            log.info("model.promoted", model=name, serving=champion.version)

    def _reject(self, event: models_pb2.ModelReady, error: ArtifactRejected) -> None:
        self._metrics.load_failures.labels(event.model_name or "_", error.reason).inc()
        log.warning(
            "model.rejected",
            model=event.model_name,
            version=event.version,
            reason=error.reason,
            error=str(error),
        )
        self.on_rejected(event, error)

    # ---- the repository extension ----

    def index(self, ready_only: bool = False) -> list[IndexEntry]:
        return self.repository.index(ready_only)

    async def load_model(self, name: str) -> None:
        """Load ``name`` again (after an unload): the versions the policy keeps.
        Raises NotFound, FailedPrecondition (no version could be loaded)."""
        if not self.repository.known(name):
            raise NotFound(f"unknown model {name!r}")
        self.repository.reloading(name)
        wanted = [
            e
            for e in self.repository.wanted(name)
            if version_number(e.version) not in self.repository.loaded_versions(name)
        ]
        results = await asyncio.gather(*(self._load(e) for e in wanted))
        if wanted and not any(results) and not self.repository.loaded_versions(name):
            raise FailedPrecondition(f"model {name!r}: no version could be loaded")

    def unload_model(self, name: str) -> None:
        """Stop serving ``name``. Requests already running finish. Raises NotFound."""
        dropped = self.repository.unload(name)
        self._metrics.loaded_versions.labels(name).set(0)
        log.info("model.unloaded", model=name, versions=[s.version for s in dropped])

    # ---- metadata ----

    def model_metadata(self, name: str, version: str = "") -> pb.ModelMetadataResponse:
        served = self.repository.resolve(name, version)
        loaded: Loaded = served.executor
        response = pb.ModelMetadataResponse(
            name=name,
            versions=[str(v) for v in self.repository.loaded_versions(name)],
            platform=loaded.runner.platform,
        )
        for sig in loaded.runner.inputs:
            response.inputs.add(name=sig.name, datatype=sig.datatype, shape=sig.shape)
        for sig in loaded.runner.outputs:
            response.outputs.add(name=sig.name, datatype=sig.datatype, shape=sig.shape)
        return response

    # ---- inference ----

    async def infer(self, request: pb.ModelInferRequest) -> pb.ModelInferResponse:
        """Raises ResourceExhausted (over the concurrency limit), NotFound
        (model, version), InvalidArgument (inputs, outputs, parameters)."""
        if self._in_flight >= self.settings.max_concurrent_requests:
            self._requests_counted(self._label(request), "RESOURCE_EXHAUSTED").inc()
            raise ResourceExhausted(
                f"{self._in_flight} requests in flight, the limit is "
                f"{self.settings.max_concurrent_requests}: retry later"
            )
        self._in_flight += 1
        if self._in_flight > 1:
            self._busy_until = time.monotonic() + BUSY_S
        self._metrics.in_flight.inc()
        started = time.perf_counter()
        code = "OK"
        try:
            return await self._infer(request, started)
        except Exception as exc:
            code = status_for(exc).name
            raise
        finally:
            self._in_flight -= 1
            self._metrics.in_flight.dec()
            label = self._label(request)
            self._requests_counted(label, code).inc()
            if code == "OK":
                self._latency_of(label).observe(time.perf_counter() - started)

    def _label(self, request: pb.ModelInferRequest) -> str:
        # Names nobody loaded stay out of the label set (a scanner must not
        # be able to grow it without bound).
        name = request.model_name
        return name if self.repository.knows(name) else UNKNOWN_MODEL_LABEL

    # A metric's child per label set, looked up once: ``labels()`` takes a
    # lock and builds a tuple on every request otherwise. The label sets are
    # bounded as the labels are (models known, status codes).
    def _requests_counted(self, label: str, code: str) -> Any:
        child = self._request_counters.get((label, code))
        if child is None:
            child = self._request_counters[label, code] = self._metrics.requests.labels(label, code)
        return child

    def _latency_of(self, label: str) -> Any:
        child = self._latencies.get(label)
        if child is None:
            child = self._latencies[label] = self._metrics.latency.labels(label)
        return child

    async def _infer(self, request: pb.ModelInferRequest, started: float) -> pb.ModelInferResponse:
        served = self.repository.resolve(request.model_name, request.model_version)
        loaded: Loaded = served.executor
        runner = loaded.runner
        known_outputs = {sig.name for sig in runner.outputs}
        for wanted in request.outputs:
            if wanted.name not in known_outputs:
                raise InvalidArgument(
                    f"unknown output {wanted.name!r}: model {served.name!r} has "
                    f"{sorted(known_outputs)}"
                )
        by_entity = entity.ENTITY_PARAMETER in request.parameters
        window: FeatureWindow | None = None
        field = ""
        if by_entity:
            entity_id, field, window = await self._entity_window(request, served)
            arrays = _entity_row(served, window, field)
        else:
            entity_id, arrays = "", decode_inputs(request, runner.inputs)
        rows = batch_rows(arrays) if runner.batched else 1
        batcher = loaded.batcher
        alone = batcher.lone_inline and await self._alone()
        outputs = await batcher.submit(arrays, rows, alone=alone)
        # 128 random bits as 32 hex digits, as the bus's event ids: unique,
        # not secret, and no syscall per request (uuid4 reads os.urandom).
        request_id = request.id or new_event_id()
        version = str(served.version)
        response = pb.ModelInferResponse(
            model_name=served.name, model_version=version, id=request_id
        )
        response.parameters[REQUEST_ID_PARAMETER].string_param = request_id
        encode_outputs(
            outputs,
            runner.outputs,
            request.outputs,
            response,
            raw=bool(request.raw_input_contents),
        )
        role = PREDICTION_ROLE_NAMED if request.model_version else PREDICTION_ROLE_CHAMPION
        shadows = (
            self.repository.challengers(served.name)
            if self._shadowing and role == PREDICTION_ROLE_CHAMPION
            else ()
        )
        shadowed = bool(shadows) and _shadow_draw() < self.settings.shadow_fraction
        prediction_log = self._prediction_log
        if prediction_log is not None and (shadowed or prediction_log.sampled(by_entity)):
            # References only: the log's thread builds the record.
            prediction_log.offer(
                Prediction(
                    request_id=request_id,
                    model_name=served.name,
                    model_version=version,
                    served_ns=time.time_ns(),
                    latency_us=int((time.perf_counter() - started) * 1e6),
                    outputs=outputs,
                    output_names=tuple(tensor.name for tensor in response.outputs),
                    entity_id=entity_id,
                    window=window,
                    tensors=() if by_entity else request.inputs,
                    arrays=None if by_entity else arrays,
                    role=role,
                )
            )
        if shadowed:
            shadow = Shadow(request, request_id, entity_id, window, field, served, arrays)
            for challenger in shadows:
                self._start_shadow(challenger, shadow)
        return response

    # ---- challengers, in the champion's shadow ----

    def _start_shadow(self, challenger: Served, shadow: Shadow) -> None:
        """Run ``challenger`` on the champion's request after the caller has
        its answer: a task of its own on the loop, never awaited by the
        request; skipped (and counted) past ``shadow_max_in_flight``."""
        if self._shadows_in_flight >= self.settings.shadow_max_in_flight:
            self._metrics.shadow_runs.labels(challenger.name, "skipped").inc()
            return
        self._shadows_in_flight += 1
        task = asyncio.get_running_loop().create_task(self._shadow(challenger, shadow))
        self._shadow_tasks.add(task)
        task.add_done_callback(self._shadow_tasks.discard)

    def _gate(self, challenger: Served) -> asyncio.Future[None]:
        """The challenger's next gate: every shadow run that arrives before
        it opens goes to the batcher with the others."""
        key = (challenger.name, challenger.version)
        gate = self._shadow_gates.get(key)
        if gate is None or gate.done():
            loop = asyncio.get_running_loop()
            gate = loop.create_future()
            loop.call_later(SHADOW_GATHER_S, _open, gate)
            self._shadow_gates[key] = gate
        return gate

    async def _shadow(self, challenger: Served, shadow: Shadow) -> None:
        await self._gate(challenger)
        started = time.perf_counter()
        loaded: Loaded = challenger.executor
        runner = loaded.runner
        try:
            if shadow.window is not None:
                arrays = _entity_row(challenger, shadow.window, shadow.field)
            elif runner.inputs == shadow.champion.executor.runner.inputs:
                arrays = shadow.arrays
            else:
                arrays = decode_inputs(shadow.request, runner.inputs)
            rows = batch_rows(arrays) if runner.batched else 1
            outputs = await loaded.batcher.submit(arrays, rows, alone=False)
        except Exception as exc:  # the challenger's own failure: no caller sees it
            self._metrics.shadow_runs.labels(challenger.name, "failed").inc()
            log.warning(
                "shadow.failed",
                model=challenger.name,
                version=challenger.version,
                error=f"{type(exc).__name__}: {exc}",
            )
            return
        finally:
            self._shadows_in_flight -= 1
        self._metrics.shadow_runs.labels(challenger.name, "ok").inc()
        assert self._prediction_log is not None  # shadows run only while it is on
        by_entity = shadow.window is not None
        self._prediction_log.offer(
            Prediction(
                request_id=shadow.request_id,
                model_name=challenger.name,
                model_version=str(challenger.version),
                served_ns=time.time_ns(),
                latency_us=int((time.perf_counter() - started) * 1e6),
                outputs=outputs,
                output_names=tuple(sig.name for sig in runner.outputs),
                entity_id=shadow.entity_id,
                window=shadow.window,
                tensors=() if by_entity else shadow.request.inputs,
                arrays=None if by_entity else arrays,
                role=PREDICTION_ROLE_SHADOW,
            )
        )

    async def _alone(self) -> bool:
        """Whether this request is the only one in the server, and none other
        was within ``BUSY_S``. It yields once first, so that requests that
        arrived with it start, and count."""
        if self._in_flight > 1 or time.monotonic() < self._busy_until:
            return False
        await asyncio.sleep(0)
        return self._in_flight == 1 and time.monotonic() >= self._busy_until

    async def _entity_window(
        self, request: pb.ModelInferRequest, served: Served
    ) -> tuple[str, str, FeatureWindow]:
        """The entity, the online-store field read for it, and its window."""
        if request.inputs or request.raw_input_contents:
            raise InvalidArgument(
                f"parameter {entity.ENTITY_PARAMETER!r} replaces the inputs: send one or the other"
            )
        entity_id = _string_parameter(request, entity.ENTITY_PARAMETER)
        field = (
            _string_parameter(request, entity.FEATURE_PARAMETER)
            if entity.FEATURE_PARAMETER in request.parameters
            else served.event.labels.get(FEATURE_LABEL, "")
        )
        if entity.WINDOW_PARAMETER in request.parameters:
            field = entity.window_field(field, _string_parameter(request, entity.WINDOW_PARAMETER))
        _row_input(served)  # a model that cannot be fed by entity fails before the read
        if self._features is None:
            raise FailedPrecondition("this server has no online store configured")
        window = await self._features.window(entity_id, field)
        return entity_id, field, window


@dataclass(frozen=True)
class Shadow:
    """A champion's request, as its challengers run it: the request, what the
    champion was fed (the window read for an entity, else the decoded
    tensors) and the champion itself."""

    request: pb.ModelInferRequest
    request_id: str
    entity_id: str
    window: FeatureWindow | None
    field: str
    champion: Served
    arrays: dict[str, NDArray[Any]]


def _row_input(served: Served) -> TensorSig:
    """The one FP32 row input of a model fed by entity; FailedPrecondition
    for a model that does not take one."""
    runner = served.executor.runner
    if len(runner.inputs) != 1 or len(runner.inputs[0].shape) != 2:
        raise FailedPrecondition(
            f"model {served.name!r} does not take one row of features: it cannot be fed by entity"
        )
    sig: TensorSig = runner.inputs[0]
    if sig.datatype != "FP32" or sig.shape[1] < 1:
        raise FailedPrecondition(f"model {served.name!r} input {sig.name!r} is not FP32 rows")
    return sig


def _entity_row(
    served: Served, window: FeatureWindow, field: str
) -> dict[str, NDArray[np.float32]]:
    """The model's input from an entity's window: one row as wide as it takes."""
    sig = _row_input(served)
    row = feature_row(window, sig.shape[1], field)
    return {sig.name: row[np.newaxis, :]}


def _open(gate: asyncio.Future[None]) -> None:
    if not gate.done():
        gate.set_result(None)


def _string_parameter(request: pb.ModelInferRequest, name: str) -> str:
    parameter = request.parameters[name]
    if parameter.WhichOneof("parameter_choice") != "string_param":
        raise InvalidArgument(f"parameter {name!r} must be a string")
    return parameter.string_param
