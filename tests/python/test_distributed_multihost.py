# Two "hosts" on one machine: one torchrun per host (--nnodes 2 on 127.0.0.1), each with its own
# OPENNEURON_HOST_ID, so the backend finds the ranks are not co-located: with one rank per host
# the world group runs over Gloo; with two, hierarchically (shared memory inside each host, Gloo
# between the hosts' leaders); subgroups inside a host share memory. The workers check the
# results of one host: exact, but float sums to rounding (dist_workers/collectives.py, ddp.py).
import pytest
from dist_util import WORKERS, assert_ok, run_torchrun, shm_segments

HOSTS = {0: {"OPENNEURON_HOST_ID": "host-a"}, 1: {"OPENNEURON_HOST_ID": "host-b"}}


@pytest.mark.parametrize("per_host", [1, 2])
def test_collectives_across_two_hosts(per_host):
    before = shm_segments()
    results = run_torchrun(str(WORKERS / "collectives.py"), per_host, "neuron", "hosts", nnodes=2,
                           node_env=HOSTS, timeout=240)
    assert_ok(results)
    assert sum(r.out.count("checks passed") for r in results) == 2 * per_host
    assert shm_segments() - before == set()


def test_ddp_across_two_hosts_matches_one_process():
    results = run_torchrun(str(WORKERS / "ddp.py"), 1, "plain", nnodes=2, node_env=HOSTS,
                           timeout=240)
    assert_ok(results)
    assert sum(r.out.count("ddp plain ok") for r in results) == 2
