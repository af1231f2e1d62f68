# A peer that exits, is killed, hangs, or calls a different collective: every other rank raises
# within the group timeout (5 s) plus a margin, naming the collective, the group, its rank and
# the peer, and stays usable (neuron ops run, destroy_process_group returns). No shared-memory
# segment is left, even after a SIGKILL (dist_workers/faults.py).
import re

import pytest
from dist_util import run_ranks, shm_segments

MARGIN = 10.0  # s beyond the 5 s group timeout (interpreter start-up is not in the timing)


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("fault", ["exit", "kill", "hang", "mismatch"])
def test_peer_fault_is_an_error_on_every_rank(fault, world):
    before = shm_segments()
    results = run_ranks("faults", world, fault, timeout=90)
    survivors = results if fault == "mismatch" else results[:-1]
    for r in survivors:
        assert r.returncode == 0, f"rank {r.rank} exit {r.returncode}\n{r.out}\n{r.err[-4000:]}"
        m = re.search(r"raised after ([\d.]+)s: (\w+): (.*)", r.out)
        assert m, r.out
        took, message = float(m.group(1)), m.group(3)
        assert took < 5.0 + MARGIN, r.out
        assert "all_reduce" in message and "group" in message, message
        assert f"rank {r.rank}" in message, message
        if fault != "mismatch":
            assert f"rank {world - 1}" in message, message  # the peer
        assert "survived" in r.out, r.out
    assert shm_segments() - before == set()
