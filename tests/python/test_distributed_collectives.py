# Every torch.distributed collective on backend "neuron" with 1, 2, 3 and 4 ranks (separate
# processes, torchrun's variables), on neuron tensors and on CPU tensors in the same group (2
# and 3 ranks: the transport is the same), against results computed from every rank's inputs
# (dist_workers/collectives.py says what is exact). No shared-memory segment may be left.
import pytest
from dist_util import assert_ok, run_ranks, shm_segments

CASES = [("neuron", 1), ("neuron", 2), ("neuron", 3), ("neuron", 4), ("cpu", 2), ("cpu", 3)]


@pytest.mark.parametrize("dev,world", CASES, ids=[f"{d}-{w}ranks" for d, w in CASES])
def test_every_collective(dev, world):
    before = shm_segments()
    results = run_ranks("collectives", world, dev, timeout=240)
    assert_ok(results)
    for r in results:
        assert "checks passed" in r.out, r.out
    assert shm_segments() - before == set()
