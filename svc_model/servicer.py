"""``inference.GRPCInferenceService`` over the inference core: translation
only. Errors raised by the core are mapped to status codes by the shared
server's error mapping (NotFound → NOT_FOUND, InvalidArgument → INVALID_ARGUMENT …).
"""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf.unknown_fields import UnknownFieldSet

from shared.contracts.inference import grpc_predict_v2_pb2 as pb
from shared.contracts.inference import grpc_predict_v2_pb2_grpc as pb_grpc
from shared.contracts.inference import model_repository_pb2 as repository_pb
from shared.errors import InvalidArgument
from svc_model.inference import EXTENSIONS, SERVER_NAME, SERVER_VERSION, InferenceCore

SERVICE_NAME = "inference.GRPCInferenceService"
INDEX_METHOD = "RepositoryIndex"
_LENGTH_DELIMITED = 2


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, core: InferenceCore) -> None:
        self._core = core

    async def ServerLive(self, request: pb.ServerLiveRequest, context: Any) -> Any:
        return pb.ServerLiveResponse(live=self._core.live())

    async def ServerReady(self, request: pb.ServerReadyRequest, context: Any) -> Any:
        return pb.ServerReadyResponse(ready=self._core.ready())

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> Any:
        return pb.ModelReadyResponse(ready=self._core.model_ready(request.name, request.version))

    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Any) -> Any:
        return pb.ServerMetadataResponse(
            name=SERVER_NAME, version=SERVER_VERSION, extensions=list(EXTENSIONS)
        )

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any) -> Any:
        return self._core.model_metadata(request.name, request.version)

    async def ModelInfer(self, request: pb.ModelInferRequest, context: Any) -> Any:
        return await self._core.infer(request)

    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: Any
    ) -> Any:
        name = _model_name(request)
        await self._core.load_model(name)
        return pb.RepositoryModelLoadResponse(model_name=name, isLoaded=True)

    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: Any
    ) -> Any:
        name = _model_name(request)
        self._core.unload_model(name)
        return pb.RepositoryModelUnloadResponse(model_name=name, isUnloaded=True)

    async def RepositoryIndex(
        self, request: repository_pb.RepositoryIndexRequest, context: Any
    ) -> Any:
        response = repository_pb.RepositoryIndexResponse()
        for entry in self._core.index(ready_only=request.ready):
            response.models.add(
                name=entry.name, version=entry.version, state=entry.state, reason=entry.reason
            )
        return response


def _model_name(request: Any) -> str:
    """The model a load or unload names: KServe's field 1, or Triton's field 2
    (which KServe's message keeps as an unknown field)."""
    if request.model_name:
        return str(request.model_name)
    for unknown in UnknownFieldSet(request):
        if unknown.field_number == 2 and unknown.wire_type == _LENGTH_DELIMITED:
            try:
                return bytes(unknown.data).decode()
            except UnicodeDecodeError as exc:
                raise InvalidArgument("model_name is not UTF-8") from exc
    raise InvalidArgument("model_name is empty")


def register(core: InferenceCore) -> Any:
    def add(server: grpc.aio.Server) -> None:
        servicer = InferenceServicer(core)
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
        index = grpc.unary_unary_rpc_method_handler(
            servicer.RepositoryIndex,
            request_deserializer=repository_pb.RepositoryIndexRequest.FromString,
            response_serializer=repository_pb.RepositoryIndexResponse.SerializeToString,
        )
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE_NAME, {INDEX_METHOD: index}),)
        )

    return add
