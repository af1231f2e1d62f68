# DistributedDataParallel on backend "neuron", unchanged but for the device string: 2 and 4
# ranks against one process training on the whole batch (dist_workers/ddp.py). One run goes
# through torchrun itself, as a user launches it.
import pytest
from dist_util import WORKERS, assert_ok, run_ranks, run_torchrun, shm_segments


@pytest.mark.parametrize("variant", ["plain", "hook", "fp16_hook", "bf16_hook", "unused",
                                     "no_sync", "buffers"])
def test_ddp_matches_one_process(variant):
    before = shm_segments()
    results = run_ranks("ddp", 2, variant, timeout=180)
    assert_ok(results)
    assert all(f"ddp {variant} ok" in r.out for r in results)
    # DDP times every iteration on a device with a registered timer (csrc/aten/distributed/timer)
    assert not any("Time stats are currently only collected" in r.err for r in results)
    assert shm_segments() - before == set()


def test_ddp_under_torchrun_4_ranks():
    results = run_torchrun(str(WORKERS / "ddp.py"), 4, "plain", timeout=240)
    assert_ok(results)
    assert results[0].out.count("ddp plain ok") == 4, results[0].out
