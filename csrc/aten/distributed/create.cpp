// How a "neuron" backend comes to be: make_backend joins the transports the Python rendezvous
// agreed on (openneuron/distributed.py), split() asks that rendezvous for a subgroup, and
// getBackendOptions() describes the group for split_group.
#include <algorithm>
#include <cstdint>
#include <mutex>
#include <random>
#include <sstream>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <utility>

#include "aten/distributed/backend.h"
#include "aten/distributed/gloo_comm.h"
#include "collectives/hier_comm.h"

namespace openneuron::aten::distributed {

namespace coll = openneuron::collectives;

namespace {

// Runs f, turning a transport failure into torch.distributed.DistBackendError.
template <class F>
auto join_or_raise(F&& f) {
  try {
    return f();
  } catch (const coll::CommError& e) {
    C10_THROW_ERROR(DistBackendError, e.what());
  }
}

std::mutex& factory_mutex() {
  static std::mutex m;
  return m;
}

SplitFactory& split_factory() {
  // NOTE: leaked on purpose: it may hold a Python callable, which must not be destroyed after
  // the interpreter has finalized.
  static auto* f = new SplitFactory();
  return *f;
}

}  // namespace

c10::intrusive_ptr<c10d::Backend> make_backend(int rank, int size,
                                               std::chrono::milliseconds timeout,
                                               const std::string& group_name, const Transports& t) {
  coll::Options opts;
  opts.group_name = group_name;
  opts.timeout = timeout;
  std::unique_ptr<coll::ShmComm> comm;
  if (!t.gloo) {
    comm = join_or_raise([&] { return coll::ShmComm::join(t.shm, rank, size, opts); });
  } else if (t.local_size <= 1) {
    comm = make_gloo_comm(rank, size, opts, t.gloo);
  } else {
    const int host = rank / t.local_size;
    coll::Options local_opts = opts, leader_opts = opts;
    local_opts.group_name = group_name + ", host " + std::to_string(host) + "'s ranks";
    leader_opts.group_name = group_name + ", host leaders";
    auto local = join_or_raise(
        [&] { return coll::ShmComm::join(t.shm, rank % t.local_size, t.local_size, local_opts); });
    std::unique_ptr<coll::ShmComm> leaders;
    if (t.leaders) leaders = make_gloo_comm(host, size / t.local_size, leader_opts, t.leaders);
    auto flat = make_gloo_comm(rank, size, opts, t.gloo);
    comm = join_or_raise([&] {
      return coll::make_hier_comm(rank, size, opts, std::move(local), std::move(leaders),
                                  std::move(flat));
    });
  }
  return c10::make_intrusive<NeuronBackend>(rank, size, group_name, std::move(comm), timeout);
}

void set_split_factory(SplitFactory factory) {
  std::lock_guard<std::mutex> lock(factory_mutex());
  split_factory() = std::move(factory);
}

c10::intrusive_ptr<c10d::Backend::Options> NeuronBackend::getBackendOptions() {
  auto opts = c10::make_intrusive<NeuronBackendOptions>(timeout_);
  opts->group_name = group_name_;
  return opts;
}

c10::intrusive_ptr<c10d::Backend> NeuronBackend::split(const c10::intrusive_ptr<c10d::Store>& store,
                                                       const std::vector<int>& ranks,
                                                       const c10::intrusive_ptr<Options>& opts) {
  // NOTE: ProcessGroup::splitGroup calls split once per device type the group serves (neuron
  // and cpu); both get the one child made by the first call, as a group made by the factory does.
  if (last_split_pending_ && last_split_ranks_ == ranks) {
    last_split_pending_ = false;
    return std::move(last_split_);  // null on the ranks left out
  }
  last_split_pending_ = false;
  last_split_.reset();
  const auto it = std::find(ranks.begin(), ranks.end(), rank_);
  const bool member = it != ranks.end();
  // NOTE: as ncclCommSplit, this is collective over this (the parent) group: every rank calls
  // it (split_group passes the ranks left out a group they are not in). The members agree here,
  // not through the store, on a store prefix of their own: torch names a split group by its
  // ranks and the number of groups each rank is in, which can differ between its members.
  struct Record {
    int32_t first = -1;  // the lowest rank of this rank's new group, or -1
    int32_t pad = 0;
    uint64_t token = 0;
  };
  Record mine;
  if (member) mine.first = *std::min_element(ranks.begin(), ranks.end());
  std::random_device rd;
  mine.token = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  std::vector<Record> all(static_cast<size_t>(size_));
  auto work = post_task("split_group",
                        [&](coll::ShmComm& c) { c.all_gather(&mine, all.data(), sizeof(Record)); });
  work->wait();
  last_split_ranks_ = ranks;
  if (!member) {
    last_split_pending_ = true;
    return {};
  }
  for (int r : ranks) {
    TORCH_CHECK(r >= 0 && r < size_ && all[r].first == mine.first,
                "neuron collectives: ", describe("split_group"), ": rank ", r,
                " is in this rank's new group but did not name the same ranks; every rank must "
                "pass the same split_ranks");
  }
  c10::intrusive_ptr<c10d::Store> root = store;
  while (auto* p = dynamic_cast<c10d::PrefixStore*>(root.get())) root = p->getUnderlyingStore();
  std::ostringstream prefix;
  prefix << "neuron/split/" << std::hex << all[mine.first].token << "/";
  auto child_store = c10::make_intrusive<c10d::PrefixStore>(prefix.str(), root);
  SplitFactory factory;
  {
    std::lock_guard<std::mutex> lock(factory_mutex());
    factory = split_factory();
  }
  TORCH_CHECK(factory, "neuron collectives: ", describe("split_group"),
              ": the backend was not registered by openneuron.distributed");
  const std::string name =
      opts && !opts->group_name.empty() ? opts->group_name : group_name_ + ":split";
  last_split_ = factory(child_store, static_cast<int>(it - ranks.begin()),
                        static_cast<int>(ranks.size()), opts ? opts->timeout : timeout_, name);
  last_split_pending_ = true;
  return last_split_;
}

}  // namespace openneuron::aten::distributed
