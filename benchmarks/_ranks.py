"""What the multi-process benchmarks share: ranks as processes on this host (the torchrun
environment, a free port), and the one "RESULT {json}" line a child prints."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys


def result(stdout: str) -> dict:
    """The JSON of the child's `RESULT ` line."""
    line = next(ln for ln in stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def run_ranks(cmd: list[str], world: int, label: str, timeout: float = 1800) -> dict:
    """`python cmd...` as ranks 0..world-1; rank 0's result. Every rank is ended if one fails
    or the timeout passes."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    try:
        for r in range(world):
            env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(world),
                       LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port))
            procs.append(subprocess.Popen([sys.executable, *cmd], env=env,
                                          stdout=subprocess.PIPE, text=True))
        outs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(p.returncode for p in procs):
        raise SystemExit(f"{label} x{world} failed")
    return result(outs[0])
