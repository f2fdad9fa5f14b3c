"""The local stack's S3-compatible object store: S3Proxy (Java, from Maven
Central, as Kafka's broker) serving a directory of the state as buckets over
the S3 API, with AWS signature v4 and one access key. Its objects are files,
so they outlive a restart of the server, as a real store's do.

``aistack infra up --object-store`` runs it (``compose.local``) and creates
``BUCKET``; the tests and the benchmarks start their own (``Standalone``,
on a free port, which they may stop and start again: an outage). Every
client reaches it through ``ObjectStoreSettings`` (endpoint, path-style,
the key).
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from pathlib import Path

from pydantic import SecretStr

from compose.processes import ManagedProcess, Readiness, Supervisor
from shared import maven, object_store
from shared.ports import free_ports
from shared.settings import ObjectStoreSettings

S3PROXY_VERSION = "4.1.0"  # keep in step with compose/s3proxy/pom.xml
POM = Path(__file__).resolve().parent / "s3proxy" / "pom.xml"
#: The bucket the stack's files go to, each kind under its own prefix.
BUCKET = "aistack"
ACCESS_KEY_ID = "aistack"
#: Where the stack's services keep their files when it runs an object store
#: (``aistack infra up --object-store``), unless the environment says otherwise.
BUCKET_LOCATIONS = {
    "AISTACK_TRAINER_ARTIFACT_ROOT": f"s3://{BUCKET}/artifacts",
    "AISTACK_TRAINER_FEATURES_PATH": f"s3://{BUCKET}/features/windows",
    "AISTACK_TRAINER_TENSORBOARD_DIR": f"s3://{BUCKET}/tensorboard",
    "AISTACK_TRANSFORM_OFFLINE_DIR": f"s3a://{BUCKET}/features/windows",
    "AISTACK_TRANSFORM_CHECKPOINT_DIR": f"s3a://{BUCKET}/transform/checkpoint",
}
#: The JVM's main class.
MAIN = "org.gaul.s3proxy.Main"

_LOGBACK = """<configuration>
  <appender name="OUT" class="ch.qos.logback.core.ConsoleAppender">
    <encoder><pattern>%d{HH:mm:ss.SSS} %-5level %logger{0} - %msg%n</pattern></encoder>
  </appender>
  <root level="WARN"><appender-ref ref="OUT"/></root>
</configuration>
"""


def home(cache_dir: Path) -> Path:
    return cache_dir / f"s3proxy-{S3PROXY_VERSION}"


def ensure_jars(cache_dir: Path) -> Path:
    """Resolve S3Proxy's jars into the cache (a no-op when already there)."""
    return maven.fetch_runtime(
        POM, home(cache_dir), expect="s3proxy-*.jar", what=f"S3Proxy {S3PROXY_VERSION} jars"
    )


@dataclass(frozen=True)
class ObjectStoreServer:
    """One S3Proxy: its files under ``directory``, listening on ``host:port``."""

    directory: Path
    host: str
    port: int

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def data(self) -> Path:
        return self.directory / "data"

    def secret(self) -> SecretStr:
        """The access key's secret: made once per directory, kept private."""
        from compose.secure import write_private

        path = self.directory / "credentials.json"
        if not path.is_file():
            self.directory.mkdir(parents=True, exist_ok=True)
            secret = secrets.token_urlsafe(24)
            write_private(path, json.dumps({ACCESS_KEY_ID: secret}).encode())
        return SecretStr(str(json.loads(path.read_text())[ACCESS_KEY_ID]))

    def settings(self) -> ObjectStoreSettings:
        """How a client reaches this server."""
        return ObjectStoreSettings(
            endpoint=self.endpoint,
            path_style=True,
            access_key_id=ACCESS_KEY_ID,
            secret_access_key=self.secret(),
        )

    def client_env(self) -> dict[str, str]:
        """``settings`` as the environment of a process started with them."""
        return object_store.settings_env(self.settings())

    def command(self, cache_dir: Path) -> list[str]:
        """The server's command line (its jars fetched first); writes its
        configuration beside its data."""
        libs = ensure_jars(cache_dir) / "libs"
        self.data.mkdir(parents=True, exist_ok=True)
        from compose.secure import write_private

        properties = self.directory / "s3proxy.conf"
        write_private(
            properties,
            "\n".join(
                [
                    f"s3proxy.endpoint={self.endpoint}",
                    "s3proxy.authorization=aws-v2-or-v4",
                    f"s3proxy.identity={ACCESS_KEY_ID}",
                    f"s3proxy.credential={self.secret().get_secret_value()}",
                    "jclouds.provider=filesystem",
                    f"jclouds.filesystem.basedir={self.data}",
                    "",
                ]
            ).encode(),
        )
        logback = self.directory / "logback.xml"
        logback.write_text(_LOGBACK)
        return [
            "java",
            "-Xmx256m",
            f"-Dlogback.configurationFile={logback}",
            "-cp",
            f"{libs}/*",
            MAIN,
            "--properties",
            str(properties),
        ]

    def ready(self) -> bool:
        """Whether it answers an authenticated request."""
        try:
            filesystem = object_store.s3_filesystem(self.settings())
            filesystem.call_s3("list_buckets")
            return True
        except Exception:
            return False

    def create_buckets(self, *buckets: str) -> None:
        for bucket in buckets:
            object_store.create_bucket(self.settings(), bucket)


class Standalone:
    """One S3Proxy on a free port, started and stopped by its owner (the
    tests, the benchmarks); ``BUCKET`` exists once it has started."""

    def __init__(self, directory: Path, cache_dir: Path) -> None:
        (port,) = free_ports(1)
        directory.mkdir(parents=True, exist_ok=True)
        self.server = ObjectStoreServer(directory, "127.0.0.1", port)
        self._cache_dir = cache_dir
        self._process = ManagedProcess(
            "object-store", "s3proxy", directory / "s3proxy.pid", directory / "s3proxy.log"
        )
        self._supervisor = Supervisor()

    @property
    def settings(self) -> ObjectStoreSettings:
        return self.server.settings()

    def env(self) -> dict[str, str]:
        """Its settings as a child process's environment."""
        return self.server.client_env()

    def url(self, key: str, scheme: str = "s3") -> str:
        """``scheme``://``BUCKET``/``key``."""
        return f"{scheme}://{BUCKET}/{key.strip('/')}"

    def start(self) -> None:
        command = self.server.command(self._cache_dir)
        self._supervisor.spawn(self._process, command, cwd=self.server.directory)
        self._supervisor.wait_ready(
            [Readiness(self._process, self.server.ready, self.server.endpoint)],
            timeout=60,
            hint="S3Proxy did not answer",
        )
        self.server.create_buckets(BUCKET)

    def stop(self) -> None:
        self._supervisor.stop([self._process], timeout=10)
