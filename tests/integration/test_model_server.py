"""svc_model on the real broker: models arrive as events, stock clients
predict, versions swap under load, bad artifacts and bad requests are refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from shared.artifacts import TORCH_EXPORT_FILE
from shared.bus.consumer import BusConsumer
from shared.bus.topics import ensure_topics
from shared.contracts.aistack.v1 import events_pb2
from shared.objective import BASELINE_VERSION, baseline_metric
from shared.ports import free_port
from shared.settings import ServingSettings
from tests.infra import Infra
from tests.integration import model_support as ms

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ms.Artifact]:
    root = tmp_path_factory.mktemp("model-artifacts")
    return {ms.TORCH: ms.export_torch(root / "torch"), ms.TF: ms.export_tf(root / "tf")}


@pytest.fixture
def topics(infra: Infra, tmp_path: Path, unique: str) -> ms.ModelSettings:
    settings = ms.settings(infra, tmp_path, unique)
    ensure_topics(settings.kafka, settings.topic_specs())
    return settings


@pytest.fixture
def serve(topics: ms.ModelSettings) -> Iterator[object]:
    servers: list[ms.ServerThread] = []

    def start(**overrides: object) -> ms.ServerThread:
        server = ms.ServerThread(topics.model_copy(update=overrides))
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def in_process(artifact: ms.Artifact, x: np.ndarray) -> np.ndarray:
    """The framework's own answer, without the server."""
    if artifact.framework == ms.TORCH:
        import torch

        module = torch.export.load(str(artifact.directory / TORCH_EXPORT_FILE)).module()
        with torch.inference_mode():
            return np.asarray(module(torch.from_numpy(x)).numpy())
    import tensorflow as tf

    loaded = tf.saved_model.load(str(artifact.directory))
    return np.asarray(loaded.signatures["serving_default"](input=tf.constant(x))["probabilities"])


def test_tritonclient_gets_what_each_framework_computes(
    infra: Infra,
    topics: ms.ModelSettings,
    serve: object,
    artifacts: dict[str, ms.Artifact],
    tmp_path: Path,
) -> None:
    ms.publish(
        infra,
        topics.models_topic,
        ms.event("digits-torch", 1, artifacts[ms.TORCH]),
        ms.event("digits-tf", 1, artifacts[ms.TF]),
    )
    server = serve()  # type: ignore[operator]
    x = ms.digits(5, seed=1)
    np.save(tmp_path / "x.npy", x)
    done = subprocess.run(
        [sys.executable, "-m", "tests.integration.triton_client", server.address,
         str(tmp_path / "x.npy"), "digits-torch", "digits-tf"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["live"] and report["ready"]
    assert "model_repository" in report["server"]["extensions"]
    for name, framework in (("digits-torch", ms.TORCH), ("digits-tf", ms.TF)):
        expected = in_process(artifacts[framework], x)
        got = report["models"][name]
        assert got["ready"]
        assert got["metadata"]["inputs"][0] == {
            "name": "input",
            "datatype": "FP32",
            "shape": ["-1", "8", "8"],
        }
        assert got["raw"]["version"] == "1"
        np.testing.assert_allclose(got["raw"]["probabilities"], expected, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got["typed"]["probabilities"], expected, rtol=1e-5, atol=1e-6)
        assert got["typed"]["id"] == "typed-1"
    # The torch.export program was served as TorchScript traced from it
    # (AISTACK_MODEL_TRACE_EXPORTED, on by default): the answers above are
    # the trace's.
    runtime = server.on_loop(
        lambda: server.server.core.repository.resolve("digits-torch", "").executor.runner.runtime
    )
    assert runtime == "traced"
    index = {(m["name"], m["version"]): m["state"] for m in report["index"]["models"]}
    assert index == {("digits-torch", "1"): "READY", ("digits-tf", "1"): "READY"}
    assert report["ready_after_unload"] is False
    assert report["ready_after_load"] is True


def test_versions_swap_under_load_without_a_failed_request(
    infra: Infra,
    topics: ms.ModelSettings,
    serve: object,
    artifacts: dict[str, ms.Artifact],
    tmp_path: Path,
) -> None:
    torch_artifact = artifacts[ms.TORCH]
    copies = [torch_artifact.copy_to(tmp_path / f"v{v}") for v in range(1, 5)]
    ms.publish(infra, topics.models_topic, ms.event("swap", 1, copies[0], val_error=0.20))
    server = serve(keep_versions=2)  # type: ignore[operator]
    x = ms.digits(3, seed=2)
    stop = threading.Event()
    failures: list[str] = []
    versions_seen: list[set[str]] = []

    def client() -> None:
        seen: set[str] = set()
        versions_seen.append(seen)
        for stub in ms.stub(server.address):
            while not stop.is_set():
                try:
                    response = stub.ModelInfer(ms.infer_request("swap", x), timeout=30)
                    seen.add(response.model_version)
                    assert ms.probabilities(response).shape == (3, 10)
                except Exception as exc:  # every failure counts, whatever it is
                    failures.append(repr(exc))

    threads = [threading.Thread(target=client) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(0.5)
        # v2 is better (promoted), v3 worse (loaded, not promoted), v4 best.
        for version, error in ((2, 0.10), (3, 0.30), (4, 0.05)):
            ms.publish(
                infra, topics.models_topic,
                ms.event("swap", version, copies[version - 1], val_error=error),
            )  # fmt: skip
            time.sleep(1.0)
        ms.wait_for(
            lambda: server.metric("aistack_model_serving_version", model="swap") == 4,
            30, "version 4 serving",
        )  # fmt: skip
        time.sleep(0.5)
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert failures == []
    assert set().union(*versions_seen) <= {"1", "2", "4"}  # never the worse v3
    assert "4" in set().union(*versions_seen)
    # Keep 2 newest (3, 4), the champion (4) and the champion it displaced
    # (2, its challenger, AISTACK_MODEL_CHALLENGERS=1): 1 is evicted.
    assert server.on_loop(lambda: server.server.core.repository.loaded_versions("swap")) == [
        2,
        3,
        4,
    ]
    for stub in ms.stub(server.address):
        # An explicit version is honoured, even one that is not the champion.
        assert stub.ModelInfer(ms.infer_request("swap", x, version="3")).model_version == "3"
        with pytest.raises(grpc.RpcError) as evicted:
            stub.ModelInfer(ms.infer_request("swap", x, version="1"))
        assert evicted.value.code() == grpc.StatusCode.NOT_FOUND


def test_latest_policy_serves_the_newest_version(
    infra: Infra,
    topics: ms.ModelSettings,
    serve: object,
    artifacts: dict[str, ms.Artifact],
) -> None:
    a = artifacts[ms.TORCH]
    ms.publish(
        infra, topics.models_topic,
        ms.event("latest", 1, a, val_error=0.01), ms.event("latest", 2, a, val_error=0.5),
    )  # fmt: skip
    server = serve(serving=ServingSettings(policy="latest"))  # type: ignore[operator]
    for stub in ms.stub(server.address):
        assert stub.ModelInfer(ms.infer_request("latest", ms.digits(1))).model_version == "2"


def test_a_tampered_artifact_is_refused_and_the_old_version_keeps_serving(
    infra: Infra,
    topics: ms.ModelSettings,
    serve: object,
    artifacts: dict[str, ms.Artifact],
    tmp_path: Path,
    unique: str,
) -> None:
    good = artifacts[ms.TORCH]
    ms.publish(infra, topics.models_topic, ms.event("guarded", 1, good, val_error=0.2))
    server = serve()  # type: ignore[operator]
    tampered = good.copy_to(tmp_path / "tampered")
    with (tampered.directory / TORCH_EXPORT_FILE).open("ab") as handle:
        handle.write(b"\0 extra bytes")
    unloadable = good.copy_to(tmp_path / "unloadable")
    (unloadable.directory / TORCH_EXPORT_FILE).write_bytes(b"not a torch program")
    from shared.artifacts import digest

    unloadable_sha, _ = digest(unloadable.directory)
    ms.publish(
        infra, topics.models_topic,
        # Claims the good digest over changed bytes, and better metrics.
        ms.event("guarded", 2, tampered, val_error=0.01),
        # Digest right, bytes no program.
        ms.event("guarded", 3, unloadable, val_error=0.01, sha256=unloadable_sha),
    )  # fmt: skip
    # Keyed by name and version, the two events may land on different
    # partitions and be read in either order: wait for both refusals.
    ms.wait_for(
        lambda: all(
            server.metric("aistack_model_load_failures_total", model="guarded", reason=r) == 1
            for r in ("unloadable", "checksum_mismatch")
        ),
        30, "both refusals",
    )  # fmt: skip
    for stub in ms.stub(server.address):
        response = stub.ModelInfer(ms.infer_request("guarded", ms.digits(2)))
        assert response.model_version == "1"
    consumer = BusConsumer(
        infra.kafka, group_id=f"dlq-{unique}", topics=[topics.dlq_topic],
        message_cls=events_pb2.DeadLetter,
    )  # fmt: skip
    letters: list[events_pb2.DeadLetter] = []
    deadline = time.monotonic() + 30
    while len(letters) < 2 and time.monotonic() < deadline:
        letters += [r.decode() for r in consumer.poll_batch(10, timeout=0.5)]
    consumer.close()
    assert sorted(letter.reason for letter in letters) == ["checksum_mismatch", "unloadable"]
    for reason in ("checksum_mismatch", "unloadable"):
        assert server.metric("aistack_model_dead_letters_total", reason=reason) == 1
    for letter in letters:
        assert letter.service == "svc_model"
        assert letter.source.topic == topics.models_topic
        assert letter.original_value  # the event's own bytes
    index = server.on_loop(lambda: server.server.core.index())
    states = {(e.version, e.state, e.reason) for e in index if e.name == "guarded"}
    assert states == {
        ("1", "READY", ""),
        ("2", "UNAVAILABLE", "checksum_mismatch"),
        ("3", "UNAVAILABLE", "unloadable"),
    }


def test_a_restarted_server_rebuilds_its_repository_from_the_topic(
    infra: Infra,
    topics: ms.ModelSettings,
    serve: object,
    artifacts: dict[str, ms.Artifact],
) -> None:
    a, b = artifacts[ms.TORCH], artifacts[ms.TF]
    ms.publish(
        infra, topics.models_topic,
        ms.event("restart", 1, a, val_error=0.3),
        ms.event("restart", 2, a, val_error=0.1),
        ms.event("restart", 3, a, val_error=0.4),
        ms.event("restart", 4, a, val_error=0.5),
        ms.event("other", 1, b),
    )  # fmt: skip
    first = serve(keep_versions=1)  # type: ignore[operator]
    before = first.on_loop(lambda: first.server.core.index(ready_only=True))
    first.stop()
    second = serve(keep_versions=1)  # type: ignore[operator]
    after = second.on_loop(lambda: second.server.core.index(ready_only=True))
    assert after == before
    # The champion (v2, lowest error), the newest (v4) and the champion v2
    # displaced (v1, its challenger) are what is loaded.
    assert {(e.name, e.version) for e in after} == {
        ("restart", "1"),
        ("restart", "2"),
        ("restart", "4"),
        ("other", "1"),
    }
    for stub in ms.stub(second.address):
        assert stub.ModelInfer(ms.infer_request("restart", ms.digits(1))).model_version == "2"


def test_a_retuned_version_serves_only_if_it_beats_the_serving_one_on_its_own_data(
    infra: Infra,
    topics: ms.ModelSettings,
    serve: object,
    artifacts: dict[str, ms.Artifact],
) -> None:
    a = artifacts[ms.TORCH]

    def challenger(name: str, value: float, serving_there: float) -> object:
        # A re-tune's version: 0.5 on the drifted data, where the serving
        # version 2 (0.1 on the data it was trained on) scored serving_there.
        ready = ms.event(name, 3, a, val_error=value, labels={BASELINE_VERSION: "2"})
        ready.metrics[baseline_metric("val_error")] = serving_there
        return ready

    ms.publish(
        infra, topics.models_topic,
        ms.event("better", 1, a, val_error=0.3),
        ms.event("better", 2, a, val_error=0.1),
        challenger("better", 0.5, serving_there=0.9),
        ms.event("worse", 1, a, val_error=0.3),
        ms.event("worse", 2, a, val_error=0.1),
        challenger("worse", 0.5, serving_there=0.4),
    )  # fmt: skip
    server = serve()  # type: ignore[operator]
    for stub in ms.stub(server.address):
        assert stub.ModelInfer(ms.infer_request("better", ms.digits(1))).model_version == "3"
        assert stub.ModelInfer(ms.infer_request("worse", ms.digits(1))).model_version == "2"


def test_concurrent_requests_are_batched_and_each_gets_its_own_rows(
    infra: Infra,
    topics: ms.ModelSettings,
    serve: object,
    artifacts: dict[str, ms.Artifact],
) -> None:
    a = artifacts[ms.TORCH]
    ms.publish(infra, topics.models_topic, ms.event("batched", 1, a))
    # Off the event loop: a request that finds none other in flight may run
    # there alone (tests/unit/test_model_lone_requests.py), and one thread's
    # channel set-up can leave its request alone; this test is about merging.
    server = serve(  # type: ignore[operator]
        batching=True, max_batch_size=64, max_queue_delay_us=20_000, inline_max_ms=0
    )
    expected = {i: in_process(a, ms.digits(i % 3 + 1, seed=i)) for i in range(16)}
    answers: dict[int, np.ndarray] = {}
    ready = threading.Barrier(16)

    def call(i: int) -> None:
        for stub in ms.stub(server.address):
            request = ms.infer_request("batched", ms.digits(i % 3 + 1, seed=i), raw=i % 2 == 0)
            ready.wait(30)  # every channel open before any request goes
            answers[i] = ms.probabilities(stub.ModelInfer(request))

    threads = [threading.Thread(target=call, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for i, want in expected.items():
        np.testing.assert_allclose(answers[i], want, rtol=1e-5, atol=1e-6)
    executions = server.metric("aistack_model_batch_size_count", model="batched")
    rows = server.metric("aistack_model_batch_size_sum", model="batched")
    assert rows == sum(i % 3 + 1 for i in range(16))  # every row ran once
    assert executions < 16  # merged: fewer executions than requests
    assert rows / executions > 1


def test_a_request_over_the_concurrency_limit_is_refused_not_queued(
    infra: Infra,
    topics: ms.ModelSettings,
    serve: object,
    artifacts: dict[str, ms.Artifact],
) -> None:
    ms.publish(infra, topics.models_topic, ms.event("limited", 1, artifacts[ms.TORCH]))
    # Off the event loop: a call run on the loop ends before the next request
    # is read, so calls there never overlap and none waits to be refused.
    server = serve(max_concurrent_requests=1, batching=False, inline_max_ms=0)  # type: ignore[operator]
    codes: list[grpc.StatusCode] = []
    lock = threading.Lock()

    def call() -> None:
        for stub in ms.stub(server.address):
            for _ in range(20):
                try:
                    stub.ModelInfer(ms.infer_request("limited", ms.digits(32)))
                    code = grpc.StatusCode.OK
                except grpc.RpcError as exc:
                    code = exc.code()
                with lock:
                    codes.append(code)

    threads = [threading.Thread(target=call) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}
    assert grpc.StatusCode.RESOURCE_EXHAUSTED in codes
    assert grpc.StatusCode.OK in codes


def test_entity_features_come_from_the_online_store(
    infra: Infra,
    topics: ms.ModelSettings,
    serve: object,
    tmp_path: Path,
    unique: str,
) -> None:
    import redis

    from shared.contracts.aistack.v1.features_pb2 import FeatureWindow
    from shared.feature_store import FEATURE_STATS, encode_window

    artifact = ms.export_regressor(tmp_path / "regressor", width=len(FEATURE_STATS))
    ms.publish(
        infra, topics.models_topic,
        ms.regressor_event(
            "forecast", 1, artifact, width=len(FEATURE_STATS), feature="temp@tumbling-60s"
        ),
    )  # fmt: skip
    prefix = f"features-{unique}:"
    window = {
        "mean": 21.5,
        "stddev": 0.5,
        "min": 20.0,
        "max": 23.0,
        "count": 12,
        "p50": 21.4,
        "p95": 22.8,
    }
    running = {**window, "count": 3, "mean": 24.0, "max": 25.0}
    client = redis.Redis.from_url(infra.redis.url)
    client.hset(f"{prefix}sensor-7", "temp@tumbling-60s", encode_window(FeatureWindow(**window)))
    client.hset(
        f"{prefix}sensor-7",
        "temp@tumbling-60s:open",
        encode_window(FeatureWindow(**running, open=True)),
    )
    client.close()
    server = serve(online_key_prefix=prefix)  # type: ignore[operator]
    from shared.contracts.inference import grpc_predict_v2_pb2 as pb

    row = np.asarray([[window[s] for s in FEATURE_STATS]], dtype=np.float32)
    for stub in ms.stub(server.address):
        by_entity = pb.ModelInferRequest(model_name="forecast")
        by_entity.parameters["entity_id"].string_param = "sensor-7"
        got = stub.ModelInfer(by_entity)
        direct = pb.ModelInferRequest(model_name="forecast")
        tensor = direct.inputs.add(name="input", datatype="FP32", shape=[1, len(FEATURE_STATS)])
        tensor.contents.fp32_contents.extend(row.ravel().tolist())
        want = stub.ModelInfer(direct)
        assert got.outputs[0].contents.fp32_contents == want.outputs[0].contents.fp32_contents
        # window=open: the running aggregate of the open window, same model.
        by_entity.parameters["window"].string_param = "open"
        got_open = stub.ModelInfer(by_entity)
        direct.inputs[0].contents.fp32_contents[:] = [float(running[s]) for s in FEATURE_STATS]
        want_open = stub.ModelInfer(direct)
        assert got_open.outputs[0].contents.fp32_contents == (
            want_open.outputs[0].contents.fp32_contents
        )
        assert got_open.outputs[0].contents.fp32_contents != got.outputs[0].contents.fp32_contents
        by_entity.parameters["window"].string_param = "latest"
        with pytest.raises(grpc.RpcError) as bad_window:
            stub.ModelInfer(by_entity)
        assert bad_window.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "'window'" in (bad_window.value.details() or "")
        unknown = pb.ModelInferRequest(model_name="forecast")
        unknown.parameters["entity_id"].string_param = "nobody"
        with pytest.raises(grpc.RpcError) as missing:
            stub.ModelInfer(unknown)
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
        assert "nobody" in (missing.value.details() or "")
    # `aistack predict --entity`: tritonclient, so in a process of its own.
    predicted = subprocess.run(
        [sys.executable, "-m", "aistack.cli", "predict", "forecast", "--entity", "sensor-7",
         "--url", server.address],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert predicted.returncode == 0, predicted.stderr
    value = got.outputs[0].contents.fp32_contents[0]
    printed = predicted.stdout.splitlines()[1]
    assert printed.startswith("prediction [1, 1]: [[")
    assert float(printed.split("[[")[1].rstrip("]")) == pytest.approx(value, abs=1e-4)
    predicted = subprocess.run(
        [sys.executable, "-m", "aistack.cli", "predict", "forecast", "--entity", "sensor-7",
         "--open", "--url", server.address],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert predicted.returncode == 0, predicted.stderr
    printed = predicted.stdout.splitlines()[1]
    assert float(printed.split("[[")[1].rstrip("]")) == pytest.approx(
        got_open.outputs[0].contents.fp32_contents[0], abs=1e-4
    )


def readme_prediction() -> str:
    """The prediction svc_model's page shows (docs/services/model.md)."""
    text = (ROOT / "docs" / "services" / "model.md").read_text()
    block = text.split("in five lines:", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert len(block.strip().splitlines()) == 5
    return block


def test_python_m_svc_model_serves_and_stops_on_sigterm(
    infra: Infra,
    topics: ms.ModelSettings,
    artifacts: dict[str, ms.Artifact],
    tmp_path: Path,
) -> None:
    ms.publish(infra, topics.models_topic, ms.event("cli", 1, artifacts[ms.TORCH]))
    port = free_port()
    env = {
        **os.environ,
        "AISTACK_KAFKA_BOOTSTRAP": infra.kafka.bootstrap,
        "AISTACK_REDIS_URL": infra.redis.url,
        "AISTACK_MODEL_GRPC_ADDRESS": f"127.0.0.1:{port}",
        "AISTACK_MODEL_MODELS_TOPIC": topics.models_topic,
        "AISTACK_MODEL_DLQ_TOPIC": topics.dlq_topic,
        "AISTACK_MODEL_METRICS_PORT": "0",
        "AISTACK_STATE_DIR": str(tmp_path / "state"),
        "AISTACK_LOG_FORMAT": "console",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "svc_model"], cwd=ROOT, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        ms.wait_for_port(port, 90, process)
        np.save(tmp_path / "x.npy", ms.digits(2))
        predicted = subprocess.run(
            [sys.executable, "-m", "aistack.cli", "predict", "cli", "--url", f"127.0.0.1:{port}",
             "--input", str(tmp_path / "x.npy")],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert predicted.returncode == 0, predicted.stderr
        assert "model cli version 1" in predicted.stdout
        assert "probabilities" in predicted.stdout
        # The page's five lines, as a newcomer would paste them.
        snippet = readme_prediction().replace("localhost:8001", f"127.0.0.1:{port}")
        np.save(tmp_path / "digit.npy", ms.digits(1)[0])
        pasted = subprocess.run(
            [sys.executable, "-c", snippet.replace('"my-study"', '"cli"')],
            cwd=tmp_path, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert pasted.returncode == 0, pasted.stderr
        assert pasted.stdout.strip().startswith("[")
    finally:
        process.terminate()
        output, _ = process.communicate(timeout=60)
    assert process.returncode == 0, output[-3000:]


def test_a_bad_setting_stops_start_up_with_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "AISTACK_MODEL_KEEP_VERSIONS": "0"}
    done = subprocess.run(
        [sys.executable, "-m", "svc_model"], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "svc_model: bad setting AISTACK_MODEL_KEEP_VERSIONS: Input should be greater than or "
        "equal to 1 (got '0')"
    ]
