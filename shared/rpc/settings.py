"""Settings every gRPC-serving service has: address, TLS, token, sizes.

A service's settings subclass this with their own ``env_prefix`` and their
own default ``grpc_address``; the fields read ``<prefix>TLS_CERT_FILE`` …
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr

from shared.rpc.server import ServerOptions
from shared.settings import ServiceSettings


class GrpcServerSettings(ServiceSettings):
    grpc_address: str = "0.0.0.0:0"
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    # Clients must present a certificate signed by this CA (mutual TLS).
    tls_client_ca_file: Path | None = None
    auth_token: SecretStr | None = None
    max_message_bytes: int = Field(default=64 * 1024 * 1024, ge=1024, le=2**31 - 1)

    def server_options(self) -> ServerOptions:
        return ServerOptions(
            address=self.grpc_address,
            tls_cert_file=self.tls_cert_file,
            tls_key_file=self.tls_key_file,
            tls_client_ca_file=self.tls_client_ca_file,
            auth_token=self.auth_token.get_secret_value() if self.auth_token else None,
            max_message_bytes=self.max_message_bytes,
        )
