// HierComm (hier_comm.h): the hierarchical collectives of a group spanning hosts. Host h holds
// ranks [h * L, (h + 1) * L); its local rank 0 is its leader. Each call makes the same sequence
// of calls on the local and leader transports on every rank, so the step protocols of both stay
// in lockstep.
#include "hier_comm.h"

#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

namespace openneuron::collectives {
namespace {

class HierComm final : public ShmComm {
 public:
  HierComm(int rank, int size, const Options& opts, std::unique_ptr<ShmComm> local,
           std::unique_ptr<ShmComm> leaders, std::unique_ptr<ShmComm> flat)
      : ShmComm(rank, size, opts),
        local_(std::move(local)),
        leaders_(std::move(leaders)),
        flat_(std::move(flat)),
        per_host_(local_->size()),
        host_(rank / per_host_) {}

  void all_reduce(const void* in, void* out, size_t count, DType dt, ReduceOp op) override {
    sync_timeouts();
    // This host's ranks reduced onto the leader, the leaders' results across hosts, then back.
    local_->reduce(in, out, count, dt, op, 0);
    if (leaders_) leaders_->all_reduce(out, out, count, dt, op);
    local_->broadcast(out, count * dtype_size(dt), 0);
  }

  void reduce(const void* in, void* out, size_t count, DType dt, ReduceOp op, int root) override {
    sync_timeouts();
    flat_->reduce(in, out, count, dt, op, root);
  }

  void broadcast(void* buf, size_t bytes, int root) override {
    sync_timeouts();
    const int root_host = root / per_host_;
    if (host_ == root_host) local_->broadcast(buf, bytes, root % per_host_);
    if (leaders_) leaders_->broadcast(buf, bytes, root_host);
    if (host_ != root_host) local_->broadcast(buf, bytes, 0);
  }

  void all_gather(const void* in, void* out, size_t bytes) override {
    sync_timeouts();
    auto* dst = static_cast<uint8_t*>(out);
    const size_t host_bytes = bytes * per_host_;
    uint8_t* mine = dst + host_ * host_bytes;
    local_->all_gather(in, mine, bytes);
    if (leaders_) {
      // NOTE: the leader's own block is staged apart: the leaders' transport need not allow
      // its input inside its output.
      std::vector<uint8_t> block(mine, mine + host_bytes);
      leaders_->all_gather(block.data(), dst, host_bytes);
    }
    // The other hosts' blocks, before and after this host's.
    local_->broadcast(dst, host_ * host_bytes, 0);
    local_->broadcast(mine + host_bytes, (size_ / per_host_ - host_ - 1) * host_bytes, 0);
  }

  void reduce_scatter(const void* in, void* out, size_t count, DType dt, ReduceOp op) override {
    sync_timeouts();
    const size_t es = dtype_size(dt);
    const bool leader = leaders_ != nullptr;
    // Every block reduced over this host onto the leader; the leaders reduce-scatter host blocks
    // (host h's ranks' blocks are consecutive); the leader scatters its host block locally.
    std::vector<uint8_t> host_sum(leader ? count * es * size_ : 0);
    local_->reduce(in, leader ? host_sum.data() : nullptr, count * size_, dt, op, 0);
    std::vector<uint8_t> host_block(leader ? count * es * per_host_ : 0);
    if (leader)
      leaders_->reduce_scatter(host_sum.data(), host_block.data(), count * per_host_, dt, op);
    local_->scatter(leader ? host_block.data() : nullptr, out, count * es, 0);
  }

  void all_to_all(const void* in, const size_t* send_offsets, const size_t* send_bytes, void* out,
                  const size_t* recv_offsets, const size_t* recv_bytes) override {
    sync_timeouts();
    flat_->all_to_all(in, send_offsets, send_bytes, out, recv_offsets, recv_bytes);
  }
  void gather(const void* in, void* out, size_t bytes, int root) override {
    sync_timeouts();
    flat_->gather(in, out, bytes, root);
  }
  void scatter(const void* in, void* out, size_t bytes, int root) override {
    sync_timeouts();
    flat_->scatter(in, out, bytes, root);
  }
  void barrier() override {
    sync_timeouts();
    flat_->barrier();
  }
  void send(const void* buf, size_t bytes, int peer, int tag) override {
    flat_->set_timeout(timeout());
    flat_->send(buf, bytes, peer, tag);
  }
  void recv(void* buf, size_t bytes, int peer, int tag) override {
    flat_->set_timeout(timeout());
    flat_->recv(buf, bytes, peer, tag);
  }

 private:
  // The glue sets this comm's timeout before each call; the parts wait under it too.
  void sync_timeouts() {
    const auto t = timeout();
    local_->set_timeout(t);
    if (leaders_) leaders_->set_timeout(t);
    flat_->set_timeout(t);
  }

  std::unique_ptr<ShmComm> local_, leaders_, flat_;
  int per_host_;
  int host_;
};

}  // namespace

std::unique_ptr<ShmComm> make_hier_comm(int rank, int size, const Options& opts,
                                        std::unique_ptr<ShmComm> local,
                                        std::unique_ptr<ShmComm> leaders,
                                        std::unique_ptr<ShmComm> flat) {
  if (!local || !flat || size % local->size() != 0 || flat->size() != size ||
      (local->rank() == 0) != (leaders != nullptr) ||
      (leaders && leaders->size() != size / local->size())) {
    throw CommError("neuron collectives: group '" + opts.group_name +
                    "': inconsistent hierarchical layout (local, leader and flat transports)");
  }
  return std::make_unique<HierComm>(rank, size, opts, std::move(local), std::move(leaders),
                                    std::move(flat));
}

}  // namespace openneuron::collectives
