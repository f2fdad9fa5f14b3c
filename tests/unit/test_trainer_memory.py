"""What a trial's processes hold (``svc_trainer.executors.memory``): a process and every
process under it, shared pages counted once."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from svc_trainer.executors import memory


def test_a_process_tree_is_found_and_its_memory_summed() -> None:
    # A child that starts a grandchild holding 200 MB it has touched.
    script = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', "
        "'import time; hoard = bytearray(200 << 20); time.sleep(60)'])\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            tree = memory.descendants(parent.pid)
            if len(tree) == 2 and memory.tree_bytes(parent.pid) > 200 << 20:
                break
            time.sleep(0.2)
        assert tree[0] == parent.pid and len(tree) == 2
        assert memory.tree_bytes(parent.pid) > 200 << 20
        assert memory.process_bytes(tree[1]) > memory.process_bytes(parent.pid)
        assert os.getpid() not in tree
        # The limit's check: the tree's holding when over it, else nothing.
        held = memory.tree_over(parent.pid, 100 << 20)
        assert held > 200 << 20
        assert memory.tree_over(parent.pid, 4 * held) == 0
        assert all(memory.resident_bytes(p) >= memory.process_bytes(p) for p in tree)
    finally:
        for pid in reversed(memory.descendants(parent.pid)):
            os.kill(pid, 9)
        parent.wait()


def test_a_process_that_is_gone_holds_nothing() -> None:
    done = subprocess.run([sys.executable, "-c", "pass"], check=True)
    assert done.returncode == 0
    assert memory.process_bytes(2**22 + 12345) == 0
    assert memory.machine_bytes() > 0
