# Process groups made every way on backend "neuron", with the default group bound to a device
# (`init_process_group(device_id=...)`): split_group (the backend splits itself), new_group,
# new_subgroups and the sub-meshes of a 2-D device mesh, each group's collectives checked
# (dist_workers/groups.py), under torchrun with 4 processes.
from dist_util import WORKERS, assert_ok, run_torchrun, shm_segments


def test_split_new_group_and_mesh_dimensions_under_torchrun():
    before = shm_segments()
    results = run_torchrun(str(WORKERS / "groups.py"), 4, timeout=240)
    assert_ok(results)
    assert results[0].out.count("groups ok") == 4, results[0].out
    assert shm_segments() - before == set()
