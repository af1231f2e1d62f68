# Runs the ranks of a distributed test as separate processes (each in its own session), with a
# deadline: on timeout or when the test ends, every process started is killed by its pid's
# process group, so a hang fails one test and never the run. Also lists this machine's leaked
# shared-memory segments of the backend, to check none is left behind.
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from conftest import _CONFIG_VARS, REPO

WORKERS = Path(__file__).resolve().parent / "dist_workers"


@dataclass
class Rank:
    rank: int
    returncode: int | None  # None: killed at the deadline
    out: str
    err: str


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shm_segments() -> set[str]:
    """This machine's segments of the backend whose creating process has ended: a segment is
    unlinked once every rank has attached, so one outliving its creator is a leak. (Segments of
    live processes, such as another test's ranks running in parallel, are not counted.)"""
    leaked = set()
    for name in os.listdir("/dev/shm"):
        parts = name.split("-")  # openneuron-<pid>-<token>
        if (len(parts) == 3 and parts[0] == "openneuron" and parts[1].isdigit()
                and not os.path.exists(f"/proc/{parts[1]}")):
            leaked.add(name)
    return leaked


def _descendants(pid: int) -> list[int]:
    """Every process below pid (by /proc parent links), deepest last."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _kill(p: subprocess.Popen) -> None:
    """Kills p and every process it started (torchrun's workers may sit in sessions of their
    own), each by its pid, so none is left and no pipe stays open."""
    for pid in [p.pid, *_descendants(p.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()


def _wait_all(procs: list[subprocess.Popen], timeout: float) -> list[Rank]:
    """Each process's exit code and output; one still running at the shared deadline is killed
    (returncode None)."""
    deadline = time.monotonic() + timeout
    results = []
    for i, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
            results.append(Rank(i, p.returncode, out, err))
        except subprocess.TimeoutExpired:
            _kill(p)
            out, err = p.communicate(timeout=10)
            results.append(Rank(i, None, out, err))
    return results


def _env(extra: dict[str, str] | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _CONFIG_VARS}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(WORKERS), env.get("PYTHONPATH", "")])
    env.update(extra or {})
    return env


def run_ranks(worker: str, world: int, *args: str, timeout: float = 120,
              env: dict[str, str] | None = None,
              rank_env: dict[int, dict[str, str]] | None = None) -> list[Rank]:
    """Starts `world` processes of dist_workers/<worker>.py with torchrun's variables (RANK,
    WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT) and waits for all of them, at most `timeout` s."""
    port = free_port()
    procs = []
    try:
        for r in range(world):
            e = _env(env)
            e.update(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(world),
                     LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                     MASTER_PORT=str(port))
            e.update((rank_env or {}).get(r, {}))
            procs.append(subprocess.Popen(
                [sys.executable, str(WORKERS / f"{worker}.py"), *args], env=e, cwd=REPO,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                start_new_session=True))
        return _wait_all(procs, timeout)
    finally:
        for p in procs:
            if p.poll() is None:
                _kill(p)


def run_torchrun(script: str, nproc: int, *args: str, timeout: float = 180,
                 env: dict[str, str] | None = None, nnodes: int = 1,
                 node_env: dict[int, dict[str, str]] | None = None) -> list[Rank]:
    """`torchrun --nproc_per_node nproc [--nnodes ...] script args` as a user runs it; with
    nnodes > 1 one torchrun per "host" on 127.0.0.1 (node_env: per-node variables such as
    OPENNEURON_HOST_ID). Returns one Rank per torchrun (its output holds its workers')."""
    port = free_port()
    procs = []
    try:
        for node in range(nnodes):
            e = _env(env)
            e.update((node_env or {}).get(node, {}))
            cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
                   f"--nnodes={nnodes}", f"--node_rank={node}", "--master_addr=127.0.0.1",
                   f"--master_port={port}", script, *args]
            procs.append(subprocess.Popen(cmd, env=e, cwd=REPO, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True,
                                          start_new_session=True))
        return _wait_all(procs, timeout)
    finally:
        for p in procs:
            if p.poll() is None:
                _kill(p)


def assert_ok(results: list[Rank]) -> None:
    bad = [r for r in results if r.returncode != 0]
    assert not bad, "\n".join(
        f"--- rank {r.rank}: exit {r.returncode if r.returncode is not None else 'KILLED (timeout)'}"
        f"\n{r.out[-3000:]}\n{r.err[-6000:]}" for r in bad)
