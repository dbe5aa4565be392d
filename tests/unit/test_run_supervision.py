"""How ``scripts/run`` ends (its supervision, ``scripts/lib.sh``): Ctrl-C or SIGTERM
is a stop asked for (says "stopping", exits 0, stops every part), while a part that
exits on its own is a failure (said, exit 1). Driven as the run command drives it,
with ``sleep`` for the parts."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Two parts that live until stopped, one that may end early; the pids go to stdout.
SCRIPT = """
. scripts/lib.sh
supervise_traps
sleep 300 & SUPERVISED+=($!)
sleep "$SHORT" & SUPERVISED+=($!)
echo "${SUPERVISED[*]}"
supervise_wait
"""


def _run(short: str) -> tuple[subprocess.Popen, list[int]]:
    proc = subprocess.Popen(
        ["bash", "-c", SCRIPT],
        cwd=ROOT,
        env={**os.environ, "SHORT": short},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    pids = [int(p) for p in proc.stdout.readline().split()]
    time.sleep(0.3)  # into supervise_wait's wait
    return proc, pids


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_says_stopping_stops_every_part_and_exits_0(signum):
    proc, pids = _run("300")
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert err.splitlines() == ["==> stopping"]  # not "a component exited"
    assert all(_gone(pid) for pid in pids)


def test_a_part_that_exits_on_its_own_is_said_and_the_run_exits_1():
    proc, pids = _run("0.5")
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 1
    assert "a component exited on its own" in err
    assert all(_gone(pid) for pid in pids)
