# FSDP2 (`fully_shard` on init_device_mesh("neuron", ...)) on backend "neuron", 2 ranks, against
# one process training on the whole batch: fp32, bf16 parameters with fp32 reduction, no
# resharding after forward, explicit prefetching, CPU offload, activation checkpointing, and a
# torch.distributed.checkpoint sharded save + load (dist_workers/fsdp.py).
import pytest
from dist_util import assert_ok, run_ranks, shm_segments


@pytest.mark.parametrize("variant", ["plain", "bf16", "no_reshard", "prefetch", "offload",
                                     "checkpoint", "dcp"])
def test_fsdp2_matches_one_process(variant, tmp_path):
    before = shm_segments()
    results = run_ranks("fsdp", 2, variant, timeout=240, env={"DCP_DIR": str(tmp_path / "ckpt")})
    assert_ok(results)
    assert all(f"fsdp {variant} ok" in r.out for r in results)
    assert shm_segments() - before == set()
