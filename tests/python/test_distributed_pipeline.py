# Pipeline parallelism (torch.distributed.pipelining: GPipe and 1F1B schedules) on backend
# "neuron": stages on 2 and 4 ranks exchange activations and gradients point to point; losses,
# gradients and parameters after two AdamW steps match one process on the same micro-batches
# (dist_workers/pipeline.py). The 4-stage run goes through torchrun, as a user launches it.
import pytest
from dist_util import WORKERS, assert_ok, run_ranks, run_torchrun, shm_segments


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pipeline_2_stages_matches_one_process(schedule):
    before = shm_segments()
    results = run_ranks("pipeline", 2, schedule, timeout=180)
    assert_ok(results)
    assert all(f"pipeline {schedule} ok" in r.out for r in results)
    assert shm_segments() - before == set()


def test_pipeline_4_stages_under_torchrun():
    results = run_torchrun(str(WORKERS / "pipeline.py"), 4, "1f1b", timeout=240)
    assert_ok(results)
    assert results[0].out.count("pipeline 1f1b ok") == 4, results[0].out
