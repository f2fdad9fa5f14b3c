"""The embedded default's launcher: idempotent up, stale pid files, taken ports."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from compose.local import LocalStack, PortTaken
from compose.settings import InfraSettings
from shared.ports import free_ports
from shared.settings import CommonSettings
from tests.infra import Infra

pytestmark = pytest.mark.integration


def stack_in(state_dir: Path, **ports: int) -> LocalStack:
    kafka_port, controller_port, redis_port = free_ports(3)
    settings = InfraSettings(
        kafka_port=ports.get("kafka_port", kafka_port),
        kafka_controller_port=ports.get("kafka_controller_port", controller_port),
        redis_port=ports.get("redis_port", redis_port),
        common=CommonSettings(state_dir=state_dir),
    )
    return LocalStack(settings)


def test_up_twice_is_harmless(infra: Infra) -> None:
    if infra.local_stack is None:
        pytest.skip("the session's servers were not started by the local launcher")
    stack = infra.local_stack
    before = stack.status()
    after = stack.up()
    assert [s.pid for s in after] == [s.pid for s in before]
    assert all(s.running for s in after)


def test_stale_pid_file_is_cleaned(tmp_path: Path) -> None:
    stack = stack_in(tmp_path)
    stack.root.mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stack.kafka.pid_file.write_text(f"{dead.pid}\n")
    stack.redis.pid_file.write_text("not a pid\n")
    assert [s.running for s in stack.status()] == [False, False]
    assert not stack.kafka.pid_file.exists()


def test_taken_port_fails_before_starting_anything(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        stack = stack_in(tmp_path, redis_port=port)
        with pytest.raises(PortTaken, match=f"port {port}.*AISTACK_INFRA_REDIS_PORT"):
            stack.up()
    assert [s.running for s in stack.status()] == [False, False]


def test_cli_reports_a_taken_port_and_exits_non_zero(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        controller_port, redis_port = free_ports(2)
        result = subprocess.run(
            [sys.executable, "-m", "aistack.cli", "infra", "up"],
            env={
                "PATH": "/usr/bin:/bin:/usr/local/bin",
                "HOME": str(Path.home()),
                "AISTACK_STATE_DIR": str(tmp_path),
                "AISTACK_INFRA_KAFKA_PORT": str(port),
                "AISTACK_INFRA_KAFKA_CONTROLLER_PORT": str(controller_port),
                "AISTACK_INFRA_REDIS_PORT": str(redis_port),
            },
            capture_output=True,
            text=True,
            check=False,
        )
    assert result.returncode == 1
    assert f"port {port}" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_cli_names_a_bad_setting(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "aistack.cli", "infra", "status"],
        env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "AISTACK_INFRA_REDIS_PORT": "http"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1
    assert (
        result.stderr.strip().splitlines() == [result.stderr.strip()]
        and "AISTACK_INFRA_REDIS_PORT" in result.stderr
    )


def test_infra_up_with_an_object_store_serves_its_bucket_until_down(tmp_path: Path) -> None:
    """``aistack infra up --object-store``: S3Proxy beside Kafka and Redis,
    its bucket created, reached with the key it prints; later commands in
    the state directory (status, down) include it without the flag."""
    import os

    from compose.object_store import BUCKET, ObjectStoreServer
    from shared import object_store

    kafka_port, controller_port, redis_port, store_port = free_ports(4)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("AISTACK_")},
        "AISTACK_STATE_DIR": str(tmp_path),
        "AISTACK_INFRA_KAFKA_PORT": str(kafka_port),
        "AISTACK_INFRA_KAFKA_CONTROLLER_PORT": str(controller_port),
        "AISTACK_INFRA_REDIS_PORT": str(redis_port),
        "AISTACK_INFRA_OBJECT_STORE_PORT": str(store_port),
    }

    def aistack(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "aistack.cli", "infra", *args],
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=180,
        )

    up = aistack("up", "--object-store")
    try:
        assert up.returncode == 0, up.stderr
        assert f"object store: http://127.0.0.1:{store_port}, bucket s3://{BUCKET}" in up.stdout
        server = ObjectStoreServer(tmp_path / "infra" / "object-store", "127.0.0.1", store_port)
        fs = object_store.s3_filesystem(server.settings())
        fs.pipe_file(f"{BUCKET}/hello.txt", b"hello")
        assert fs.cat_file(f"{BUCKET}/hello.txt") == b"hello"
        status = aistack("status")
        assert status.returncode == 0 and "object-store" in status.stdout, status.stdout
    finally:
        down = aistack("down")
    assert down.returncode == 0, down.stderr
    assert "object-store" in down.stdout and "running" not in down.stdout
