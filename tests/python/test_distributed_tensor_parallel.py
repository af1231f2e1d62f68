# DTensor, tensor parallelism (also with attention on DTensors) and sequence parallelism
# (parallelize_module on a Llama-style block) on backend "neuron", on 2 and 4 ranks, and FSDP2 +
# TP on a 2-D mesh, against one process (dist_workers/tensor_parallel.py).
import pytest
from dist_util import assert_ok, run_ranks, shm_segments

CASES = [("dtensor", 2), ("tp", 2), ("tp_dt", 2), ("sp", 2), ("dtensor", 4), ("tp", 4),
         ("fsdp_tp", 4)]


@pytest.mark.parametrize("variant,world", CASES, ids=[f"{c[0]}-{c[1]}ranks" for c in CASES])
def test_tensor_parallel_matches_one_process(variant, world):
    before = shm_segments()
    results = run_ranks("tensor_parallel", world, variant, timeout=240)
    assert_ok(results)
    assert all(f"{variant} ok" in r.out for r in results)
    assert shm_segments() - before == set()
