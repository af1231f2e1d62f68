// Collectives of a group that spans hosts, each host holding the same number of consecutive
// ranks (as torchrun assigns them), composed from three transports: shared memory among this
// host's ranks, one leader per host (the host's local rank 0) talking to the other hosts'
// leaders, and a flat group of every rank. all_reduce, reduce_scatter, all_gather and broadcast
// are hierarchical (the inter-host leg carries each host's data once, not once per rank); the
// other calls go over the flat group. Torch-free: the glue passes Gloo-backed comms as the
// leaders and flat transports (csrc/aten/distributed/gloo_comm.h); tests pass shared-memory ones.
#pragma once

#include <memory>

#include "shm_comm.h"

namespace openneuron::collectives {

// local: this host's ranks (local rank = rank % local->size()); leaders: one rank per host (host
// index = rank / local->size()), on local rank 0 only (null elsewhere); flat: every rank, in
// rank order. Float sums are reduced per host, then across hosts in host order (so they may
// differ in the last bits from a one-host group's rank-order sums, as NCCL's do by topology).
std::unique_ptr<ShmComm> make_hier_comm(int rank, int size, const Options& opts,
                                        std::unique_ptr<ShmComm> local,
                                        std::unique_ptr<ShmComm> leaders,
                                        std::unique_ptr<ShmComm> flat);

}  // namespace openneuron::collectives
