# FSDP2 (`fully_shard` on init_device_mesh("neuron", ...)) on backend "neuron" against one process
# training on the whole batch: on 2 ranks fp32, bf16 parameters with fp32 reduction, no
# resharding after forward, explicit prefetching, CPU offload, activation checkpointing, and a
# torch.distributed.checkpoint sharded save + load, the PyTorch FSDP2 example's flow (meta-device
# init, to_empty, gradient clipping); on 4 ranks under torchrun, plain FSDP and
# HSDP (a 2 x 2 mesh: replicate x shard) (dist_workers/fsdp.py).
import pytest
from dist_util import WORKERS, assert_ok, run_ranks, run_torchrun, shm_segments


@pytest.mark.parametrize("variant", ["plain", "bf16", "no_reshard", "prefetch", "offload",
                                     "checkpoint", "dcp", "meta_clip"])
def test_fsdp2_matches_one_process(variant, tmp_path):
    before = shm_segments()
    results = run_ranks("fsdp", 2, variant, timeout=240, env={"DCP_DIR": str(tmp_path / "ckpt")})
    assert_ok(results)
    assert all(f"fsdp {variant} ok" in r.out for r in results)
    assert shm_segments() - before == set()


@pytest.mark.parametrize("variant", ["plain", "hsdp"])
def test_fsdp2_4_ranks_under_torchrun(variant):
    before = shm_segments()
    results = run_torchrun(str(WORKERS / "fsdp.py"), 4, variant, timeout=240)
    assert_ok(results)
    assert results[0].out.count(f"fsdp {variant} ok") == 4, results[0].out
    assert shm_segments() - before == set()
