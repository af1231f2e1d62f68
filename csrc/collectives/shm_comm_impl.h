// Internal to csrc/collectives: ShmCommImpl, the one implementation of ShmComm — its state,
// the wait loop every blocking call goes through, and failure reporting. The collectives are
// in shm_comm.cpp, send/recv in p2p.cpp, the segment itself in segment.h.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "segment.h"
#include "shm_comm.h"

namespace openneuron::collectives {

enum class CallOp : uint8_t {
  kNone,
  kAllReduce,
  kReduce,
  kBroadcast,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kGather,
  kScatter,
  kBarrier,
};
const char* call_op_name(CallOp op);  // "all_reduce", ...

// What a rank publishes per collective call, for the mismatch check. Fields an op does not use
// stay at their defaults.
struct Call {
  CallOp op = CallOp::kNone;
  uint64_t count = 0;  // elements for reductions, bytes otherwise
  int dtype = -1;      // DType, or -1
  int redop = -1;      // ReduceOp, or -1
  int root = -1;
  uint64_t packed() const;
  static Call unpack(uint64_t packed, uint64_t count);
  bool operator==(const Call& o) const { return packed() == o.packed() && count == o.count; }
  std::string describe() const;  // "all_reduce(count=10, float32, SUM)"
};

class ShmCommImpl final : public ShmComm {
 public:
  ShmCommImpl(std::string name, int rank, int size, const Options& opts, shm::Mapping mapping,
              const shm::Layout& layout);
  // Marks this rank as gone (peers waiting for it fail at once) and unmaps. Never blocks.
  ~ShmCommImpl() override;
  // Registers this rank and waits until all have; then unlinks the name. Throws CommError.
  void attach(shm::Clock::time_point deadline);

  void all_reduce(const void* in, void* out, size_t count, DType dt, ReduceOp op) override;
  void reduce(const void* in, void* out, size_t count, DType dt, ReduceOp op, int root) override;
  void broadcast(void* buf, size_t bytes, int root) override;
  void all_gather(const void* in, void* out, size_t bytes) override;
  void reduce_scatter(const void* in, void* out, size_t count, DType dt, ReduceOp op) override;
  void all_to_all(const void* in, const size_t* send_offsets, const size_t* send_bytes, void* out,
                  const size_t* recv_offsets, const size_t* recv_bytes) override;
  void gather(const void* in, void* out, size_t bytes, int root) override;
  void scatter(const void* in, void* out, size_t bytes, int root) override;
  void barrier() override;
  void send(const void* buf, size_t bytes, int peer, int tag) override;
  void recv(void* buf, size_t bytes, int peer, int tag) override;

 private:
  // --- the segment
  shm::Control& ctl() const { return *reinterpret_cast<shm::Control*>(base_); }
  shm::RankBlock& block(int r) const {
    return reinterpret_cast<shm::RankBlock*>(base_ + layout_.ranks)[r];
  }
  // kind 0: bytes sender sends to peer; kind 1: bytes sender expects from peer.
  std::atomic<uint64_t>& a2a_word(uint64_t seq, int sender, int kind, int peer) const;
  shm::Channel& channel(int from, int to) const;
  uint8_t* channel_data(int from, int to) const;
  // This rank's view of rank r's slot half for the current use.
  uint8_t* slot(int r) const {
    return base_ + layout_.slots + (static_cast<size_t>(r) * 2 + (use_ & 1)) * layout_.half;
  }

  // --- collectives (shm_comm.cpp)
  // Publishes the call descriptor of the next call; throws if this comm is unusable.
  void begin(const Call& call);
  // Publishes this rank's arrival at the next step and waits until every rank has arrived;
  // the call's first step also compares the descriptors.
  void step();
  void next_half() { ++use_; }
  size_t step_bytes() const;
  void check_calls();
  void check_all_to_all_sizes(uint64_t* max_bytes);
  void check_reduce_args(const char* op, DType dt, ReduceOp red) const;
  void check_root(const char* op, int root) const;
  // all_reduce (root < 0) and reduce (root >= 0) after begin().
  void reduce_impl(const uint8_t* in, uint8_t* out, size_t count, DType dt, ReduceOp op, int root);
  // dst = reduction over every rank's slot at element offset `first`, n elements, rank order.
  void reduce_slots(void* dst, size_t first, size_t n, size_t elem_offset_bytes, DType dt,
                    ReduceOp op);

  // --- waiting and failing
  // "neuron collectives: <op> on group 'g' (rank r of n)"
  std::string prefix(const std::string& op) const;
  // Throws CommError at once if this comm failed earlier or a peer has published a failure.
  void check_usable(const std::string& op);
  // Records the failure (first one wins), poisons this comm, tells the peers, throws.
  [[noreturn]] void fail(const std::string& message);
  // Called between sleeps of a wait: why it must stop (a peer failed, left or exited, or the
  // timeout passed), as the rest of a message after prefix(); empty to go on waiting.
  // `peers`: the ranks being waited for.
  std::string wait_failure(const std::vector<int>& peers, const char* hint,
                           std::chrono::milliseconds timeout, bool timed_out,
                           bool check_processes) const;
  // Waits until ready(); between sleeps on `f`, fails with prefix(describe()) + wait_failure()
  // for the ranks blame() names.
  template <class Ready, class Blame, class Describe>
  void wait_until(shm::Futex& f, Ready ready, Blame blame, Describe describe, const char* hint);

  // --- send/recv (p2p.cpp)
  void check_peer(const char* op, int peer, int tag) const;
  // Copies n bytes of the channel from `peer` to dst as they arrive; `tail` is the receiver's.
  void channel_read(int peer, uint64_t& tail, uint8_t* dst, size_t n, const std::string& what);

  std::string name_;
  shm::Mapping mapping_;
  uint8_t* base_;
  shm::Layout layout_;
  bool attached_ = false;  // this rank's block is ours (set by attach())
  // Collectives thread only.
  uint64_t seq_ = 0;   // collective calls begun
  uint64_t step_ = 0;  // steps arrived
  uint64_t use_ = 0;   // slot-half uses: the half is use_ % 2
  bool first_step_ = false;
  Call call_;                        // the current collective, for messages
  std::vector<const void*> inputs_;  // scratch for reduce_slots
  // Failure state, any thread.
  std::atomic<bool> poisoned_{false};
  std::mutex error_mu_;
  std::string first_error_;
  // Messages received ahead of a recv with their tag, per sender. Recvs from one peer may run
  // on several threads at once (the c10d backend has a thread per (peer, tag)): the sender's
  // channel and its pending queues are read under recv_mu_[peer], never waited on under it;
  // queued_[peer] counts queued messages, so a recv waiting for its tag sees one another
  // thread set aside.
  std::vector<std::map<int, std::deque<std::vector<uint8_t>>>> pending_;
  std::unique_ptr<std::mutex[]> recv_mu_;
  // Sends to one peer from several threads (one per tag) write its ring one whole message at a
  // time: send_mu_[peer] is held from header to last byte (the receiver drains other tags'
  // messages, so a blocked send always moves on).
  std::unique_ptr<std::mutex[]> send_mu_;
  std::unique_ptr<std::atomic<uint64_t>[]> queued_;
};

template <class Ready, class Blame, class Describe>
void ShmCommImpl::wait_until(shm::Futex& f, Ready ready, Blame blame, Describe describe,
                             const char* hint) {
  using namespace std::chrono;
  constexpr auto kSlice = milliseconds(100);
  if (ready()) return;
  const milliseconds timeout = this->timeout();
  const auto start = shm::Clock::now();
  const auto deadline = start + timeout;
  shm::Spinner spinner(microseconds(50));
  while (spinner.step()) {
    if (ready()) return;
  }
  auto next_process_check = start;
  for (;;) {
    f.waiters.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t seen = f.word.load(std::memory_order_seq_cst);
    if (ready()) {
      f.waiters.fetch_sub(1, std::memory_order_seq_cst);
      return;
    }
    const auto now = shm::Clock::now();
    const bool timed_out = now >= deadline;
    const bool check_processes = timed_out || now >= next_process_check;
    if (check_processes) next_process_check = now + kSlice;
    const std::string why = wait_failure(blame(), hint, timeout, timed_out, check_processes);
    if (!why.empty()) {
      f.waiters.fetch_sub(1, std::memory_order_seq_cst);
      fail(prefix(describe()) + why);
    }
    shm::futex_sleep(f, seen, std::min<nanoseconds>(kSlice, deadline - now));
    f.waiters.fetch_sub(1, std::memory_order_seq_cst);
  }
}

}  // namespace openneuron::collectives
