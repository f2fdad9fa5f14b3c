"""``make bench``'s closing table (bench.all) and ``--profile``'s profiles
(bench.profiling): the ratio lines read back, a failed benchmark kept as a
row, and py-spy really sampling a busy process."""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import all as bench_all
from bench import profiling
from bench.harness import ratio_line

PRINTS = "import sys; print('warming up'); print({line!r}); print({other!r}); sys.exit({code})"


def test_every_line_the_harness_writes_is_read_back_as_it_was_meant() -> None:
    peer = bench_all.parse_line("serving", ratio_line("aistack_vs_kserve_c16", 0.784, 1.5))
    assert peer == bench_all.Figure("serving", "aistack_vs_kserve_c16", 0.78, 1.5)
    assert not peer.holds
    itself = bench_all.parse_line("tuner", ratio_line("two_vs_one", 1.93, 1.8, itself=True))
    assert itself is not None and itself.itself and itself.holds
    assert bench_all.parse_line("x", "plain loop: 349,429 samples/s") is None
    assert bench_all.parse_line("x", "chaos_lost_or_doubled: 0 (goal 0)") is None


def test_a_run_keeps_each_benchmarks_figures_and_a_failed_one_as_a_row_that_does_not_hold(
    capsys: pytest.CaptureFixture[str],
) -> None:
    good = [
        sys.executable,
        "-c",
        PRINTS.format(
            line=ratio_line("fast", 1.25, 1.0), other=ratio_line("slow", 0.5, 0.95), code=0
        ),
    ]
    bad = [
        sys.executable,
        "-c",
        PRINTS.format(line=ratio_line("half", 0.9, 0.8), other="Traceback ...", code=3),
    ]
    figures = bench_all.run_one("good", good) + bench_all.run_one("bad", bad)
    passed_through = capsys.readouterr().out
    assert "warming up" in passed_through and "Traceback ..." in passed_through
    assert [(f.bench, f.name, f.holds) for f in figures] == [
        ("good", "fast", True),
        ("good", "slow", False),
        ("bad", "half", True),
        ("bad", "(the benchmark)", False),
    ]
    rows = bench_all.table(figures).splitlines()
    assert rows[0].split() == ["benchmark", "figure", "ratio", "goal", "holds"]
    assert rows[2].split() == ["good", "fast", "1.25", "1", "yes"]
    assert rows[3].split() == ["good", "slow", "0.50", "0.95", "NO"]
    assert rows[5].split() == ["bad", "(the", "benchmark)", "exited", "3", "NO"]


def test_top_frames_rank_by_the_share_each_frame_ran_and_was_on_the_stack() -> None:
    frames = [{"name": name, "file": f"/x/{name}.py", "line": 1} for name in "abcd"]
    frames.append({"name": 'process 7:"python -m svc_x"', "file": "", "line": 0})
    frames.append({"name": "_find_and_load", "file": "<frozen importlib._bootstrap>", "line": 9})
    # Thread 1: a>b (3 samples' time), a>c (1), an import under a (left
    # out); thread 2, of process 7: d (4).
    document = {
        "shared": {"frames": frames},
        "profiles": [
            {"samples": [[0, 1], [0, 2], [0, 5, 1]], "weights": [0.03, 0.01, 0.5]},
            {"samples": [[4, 3]], "weights": [0.04]},
        ],
    }
    samples, shares = profiling.top_frames(document, limit=3)
    assert samples == 3
    assert [s.frame for s in shares] == ["d (/x/d.py:1)", "b (/x/b.py:1)", "c (/x/c.py:1)"]
    assert [s.self_share for s in shares] == pytest.approx([0.5, 0.375, 0.125])
    assert [s.total_share for s in shares] == pytest.approx([0.5, 0.375, 0.125])
    _, everything = profiling.top_frames(document, limit=10)
    assert ("a (/x/a.py:1)", 0.0) == (everything[-1].frame, everything[-1].self_share)
    assert everything[-1].total_share == pytest.approx(0.5)
    assert len(everything) == 4  # the process's root frame is no code
    document["profiles"][0]["name"] = 'Process 7 Thread 8 "prediction-log"'
    document["profiles"][1]["name"] = "Process 7 Thread 7"
    assert dict(profiling.thread_seconds(document)) == {
        "prediction-log": pytest.approx(0.04),  # the import's 0.5 s left out
        "7": pytest.approx(0.04),
    }


BUSY = """
import time

def spin_in_a_named_function():
    end = time.monotonic() + 60
    while time.monotonic() < end:
        sum(i * i for i in range(1000))

spin_in_a_named_function()
"""


def test_py_spy_samples_a_spawned_process_into_a_flame_graph_and_a_top_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profiler = profiling.Profiler("unit", out_dir=tmp_path)
    busy = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        profiler.attach(busy.pid, profiling.label_of([sys.executable, "-c", BUSY]))
        time.sleep(3)
    finally:
        busy.kill()
        busy.wait()
    written = profiler.finish()
    assert {p.name for p in written} == {
        f"unit-{Path(sys.executable).name}.speedscope.json",
        f"unit-{Path(sys.executable).name}.top.txt",
    }
    flame = next(p for p in written if p.suffix == ".json")
    samples, shares = profiling.top_frames(json.loads(flame.read_text()), 5)
    assert samples > 100  # about 3 s at 100 Hz
    # Its frames (the function and its generator, at each line) ran nearly always.
    assert "spin_in_a_named_function" in shares[0].frame
    spinning = sum(s.self_share for s in shares if "spin_in_a_named_function" in s.frame)
    assert spinning > 0.9
    assert "spin_in_a_named_function" in capsys.readouterr().out


def test_the_flag_starts_the_profiler_as_the_arguments_are_read(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    started: list[tuple[int, str, bool]] = []

    class Recording(profiling.Profiler):
        def __init__(self, bench: str) -> None:
            super().__init__(bench, out_dir=tmp_path)

        def attach(
            self, pid: int, label: str, *, subprocesses: bool = True, unique: bool = False
        ) -> None:
            started.append((pid, label, subprocesses))

    monkeypatch.setattr(profiling, "Profiler", Recording)
    monkeypatch.setattr(atexit, "register", lambda fn: None)
    monkeypatch.setattr(profiling, "_active", None)
    monkeypatch.setenv(profiling.DRIVER_OPTIONS_ENV, "-Xss4m")
    parser = argparse.ArgumentParser()
    profiling.add_flag(parser, "scoring", own_children=True)
    assert parser.parse_args([]).profile is False and profiling.active() is None
    assert parser.parse_args(["--profile"]).profile is True
    assert started and started[0][1:] == ("bench", True)
    assert profiling.active() is not None
    # A Spark session the benchmark starts itself records its JVM.
    options = os.environ[profiling.DRIVER_OPTIONS_ENV]
    assert options.startswith("-Xss4m -XX:StartFlightRecording=")
    assert f"filename={tmp_path / 'scoring-bench.jfr.d'}," in options
    assert profiling.label_of([sys.executable, "-m", "svc_ingest"]) == "svc_ingest"
    assert profiling.label_of([sys.executable, "-m", "bench.ingest_peers", "quix"]) == (
        "bench_ingest_peers"
    )


PRINTED = """jdk.ExecutionSample {
  startTime = 23:37:26.166
  sampledThread = "Executor task launch worker for task 3.0 in stage 7.0 (TID 3)" (javaThreadId = 6)
  state = "STATE_RUNNABLE"
  stackTrace = [
    org.apache.spark.unsafe.types.ByteArray.compareBinary(byte[], byte[]) line: 90
    org.apache.spark.util.collection.TimSort.sort(Object, int, int, Comparator) line: 12
    java.lang.Thread.run()
  ]
}

jdk.ExecutionSample {
  startTime = 23:37:26.176
  sampledThread = "Executor task launch worker for task 4.0 in stage 7.0 (TID 2)" (javaThreadId = 8)
  state = "STATE_RUNNABLE"
  stackTrace = [
    java.lang.Object.hashCode()
    org.apache.spark.util.collection.TimSort.sort(Object, int, int, Comparator) line: 14
    java.lang.Thread.run()
  ]
}

jdk.ExecutionSample {
  startTime = 23:37:26.186
  sampledThread = "stream execution thread for windows [id = QUERY_ID]" (javaThreadId = 40)
  state = "STATE_RUNNABLE"
  stackTrace = [
    java.lang.Object.hashCode()
    java.lang.Thread.run()
  ]
}
""".replace("QUERY_ID", "5c1f8a2e-93d0-4b7a-a1c2-0d9e8f7a6b5c")


def test_the_jvms_samples_rank_its_methods_and_its_threads_by_name() -> None:
    samples, shares, threads = profiling.jvm_top_frames(PRINTED.splitlines(keepends=True), 10)
    assert samples == 3
    by_frame = {share.frame: share for share in shares}
    # A native frame (no line) that ran is counted where it ran.
    assert by_frame["java.lang.Object.hashCode"].self_share == pytest.approx(2 / 3)
    assert by_frame["org.apache.spark.util.collection.TimSort.sort"].total_share == pytest.approx(
        2 / 3
    )
    assert by_frame["org.apache.spark.util.collection.TimSort.sort"].self_share == 0
    assert by_frame["java.lang.Thread.run"].total_share == 1
    assert shares[0].frame == "java.lang.Object.hashCode"
    # Task threads are one kind, whatever their task.
    assert threads == [
        ("Executor task launch worker for task N.N in stage N.N (TID N)", pytest.approx(2 / 3)),
        ("stream execution thread for windows [id = ID]", pytest.approx(1 / 3)),
    ]


def test_a_spawned_process_gets_its_own_recording_whatever_its_parent_asked(
    tmp_path: Path,
) -> None:
    profiler = profiling.Profiler("unit", out_dir=tmp_path)
    parent = "-Xss4m -XX:StartFlightRecording=filename=/x"
    label = profiler.unique_label("svc_transform")
    env = profiler.jvm_env({"A": "1", profiling.DRIVER_OPTIONS_ENV: parent}, label)
    assert env[profiling.DRIVER_OPTIONS_ENV] == (
        f"-Xss4m -XX:StartFlightRecording=filename={tmp_path / 'unit-svc_transform.jfr.d'},"
        "settings=profile,dumponexit=true"
    )
    assert env["A"] == "1" and (tmp_path / "unit-svc_transform.jfr.d").is_dir()
    assert profiler.unique_label("svc_transform") == "svc_transform-2"


BUSY_JAVA = """
public final class Busy {
  static double spinInANamedMethod(long until) {
    double sum = 0;
    while (System.nanoTime() < until) {
      for (int i = 0; i < 100_000; i++) sum += Math.sqrt(i);
    }
    return sum;
  }
  public static void main(String[] args) {
    System.out.println(spinInANamedMethod(System.nanoTime() + 3_000_000_000L));
  }
}
"""


@pytest.mark.skipif(
    shutil.which("javac") is None or profiling.jfr_executable() is None,
    reason="needs a JDK (javac, jfr): make setup's machine has one",
)
def test_a_jvm_records_itself_into_a_table_of_its_java_frames(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "Busy.java"
    source.write_text(BUSY_JAVA)
    subprocess.run(["javac", "-d", str(tmp_path), str(source)], check=True)
    profiler = profiling.Profiler("unit", out_dir=tmp_path / "out")
    env = profiler.jvm_env({}, profiler.unique_label("busy"))
    # What spark-submit does with SPARK_SUBMIT_OPTS: the driver JVM's options.
    options = env[profiling.DRIVER_OPTIONS_ENV].split()
    subprocess.run(["java", *options, "-cp", str(tmp_path), "Busy"], check=True)
    written = profiler.finish()
    table = tmp_path / "out" / "unit-busy.jvm-top.txt"
    assert table in written
    text = table.read_text()
    assert "execution samples" in text
    # The method that spun ran in nearly every sample.
    top = text.splitlines()[3]
    assert top.endswith("Busy.spinInANamedMethod"), text
    assert float(top.split("%")[0]) > 80, text
    assert "Busy.spinInANamedMethod" in capsys.readouterr().out
