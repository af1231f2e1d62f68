// ShmComm over one shared-memory segment: join, the step protocol (arrive, wait, compare call
// descriptors), failure reporting, and the collective algorithms over the per-rank slots.
// send/recv are in p2p.cpp, the segment layout and futex calls in segment.cpp, the reduction
// loops in reduce.cpp.
//
// NOTE: the step protocol. Rank r publishes step s by storing arrived[r] = s after writing its
// slot; a step returns once every rank's arrived >= s. Each call alternates the slot half it
// uses (use_ % 2) and every use contains at least one step, so when a rank writes a half, every
// peer has arrived at a step after its last read of that half: one wait per small all_reduce.
#include "shm_comm.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "reduce.h"
#include "segment.h"
#include "shm_comm_impl.h"

namespace openneuron::collectives {
namespace {

// Reductions up to this size (and a slot half) take one step: every rank reduces all slots.
constexpr size_t kDirectBytes = 32 << 10;
// Large messages move in steps of at most this many bytes per rank (less than a slot half): a
// step's slots stay in the cores' caches between the rank that writes and the ranks that read,
// so memory sees each byte of the message about once (64 MiB all_reduce of 2 ranks: 21 ms in
// 2 MiB steps, 15 ms in 256 KiB steps, on a 2-core Xeon).
constexpr size_t kStepBytes = 256 << 10;

constexpr const char* kCallHint =
    "did not make the same call; check that every rank calls the same collectives in the same "
    "order";

std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) {
    s += (i ? ", " : "") + std::to_string(ranks[i]);
  }
  return s;
}

size_t chunks_of(size_t total, size_t chunk) {
  return total == 0 ? 1 : (total + chunk - 1) / chunk;
}

}  // namespace

const char* call_op_name(CallOp op) {
  switch (op) {
    case CallOp::kNone:
      return "none";
    case CallOp::kAllReduce:
      return "all_reduce";
    case CallOp::kReduce:
      return "reduce";
    case CallOp::kBroadcast:
      return "broadcast";
    case CallOp::kAllGather:
      return "all_gather";
    case CallOp::kReduceScatter:
      return "reduce_scatter";
    case CallOp::kAllToAll:
      return "all_to_all";
    case CallOp::kGather:
      return "gather";
    case CallOp::kScatter:
      return "scatter";
    case CallOp::kBarrier:
      return "barrier";
  }
  return "unknown";
}

uint64_t Call::packed() const {
  return static_cast<uint64_t>(op) | static_cast<uint64_t>((dtype + 1) & 0xFF) << 8 |
         static_cast<uint64_t>((redop + 1) & 0xFF) << 16 |
         static_cast<uint64_t>(static_cast<uint32_t>(root + 1)) << 32;
}

Call Call::unpack(uint64_t packed, uint64_t count) {
  Call c;
  c.op = static_cast<CallOp>(packed & 0xFF);
  c.dtype = static_cast<int>((packed >> 8) & 0xFF) - 1;
  c.redop = static_cast<int>((packed >> 16) & 0xFF) - 1;
  c.root = static_cast<int>(static_cast<uint32_t>(packed >> 32)) - 1;
  c.count = count;
  return c;
}

std::string Call::describe() const {
  std::string s = std::string(call_op_name(op)) + "(";
  std::vector<std::string> parts;
  if (dtype >= 0) {
    parts.push_back("count=" + std::to_string(count));
    parts.push_back(dtype_name(static_cast<DType>(dtype)));
  } else if (op != CallOp::kBarrier && op != CallOp::kAllToAll) {
    parts.push_back("bytes=" + std::to_string(count));
  }
  if (redop >= 0) parts.push_back(reduce_op_name(static_cast<ReduceOp>(redop)));
  if (root >= 0) parts.push_back("root=" + std::to_string(root));
  for (size_t i = 0; i < parts.size(); ++i) s += (i ? ", " : "") + parts[i];
  return s + ")";
}

// --- join --------------------------------------------------------------------------------------

std::unique_ptr<ShmComm> ShmComm::join(const std::string& name, int rank, int size,
                                       const Options& opts) {
  const std::string who = "neuron collectives: joining group '" + opts.group_name + "' as rank " +
                          std::to_string(rank) + " of " + std::to_string(size) + " (segment " +
                          name + ")";
  if (size < 1 || rank < 0 || rank >= size) {
    throw CommError(who + " failed: the rank must be in [0, world size) and the world size >= 1");
  }
  if (name.size() < 2 || name[0] != '/' || name.find('/', 1) != std::string::npos ||
      name.size() > 255) {
    throw CommError(who +
                    " failed: the segment name must be '/' followed by up to 254 "
                    "characters other than '/'");
  }
  if (opts.slot_bytes < 128 * static_cast<size_t>(size) || opts.channel_bytes < 64) {
    throw CommError(who + " failed: slot_bytes (" + std::to_string(opts.slot_bytes) +
                    ") must be at least 128 * world size and channel_bytes (" +
                    std::to_string(opts.channel_bytes) + ") at least 64");
  }
  const auto deadline = shm::Clock::now() + opts.timeout;
  const shm::Layout layout = shm::Layout::compute(size, opts.slot_bytes, opts.channel_bytes);
  shm::Mapping mapping = rank == 0 ? shm::segment_create(name, layout.total, who)
                                   : shm::segment_open(name, layout.total, deadline, who);
  auto& ctl = *reinterpret_cast<shm::Control*>(mapping.base());
  if (rank == 0) {
    ctl.size.store(static_cast<uint64_t>(size), std::memory_order_relaxed);
    ctl.slot_bytes.store(opts.slot_bytes, std::memory_order_relaxed);
    ctl.channel_bytes.store(opts.channel_bytes, std::memory_order_relaxed);
    ctl.magic.store(shm::kMagic, std::memory_order_release);
  } else {
    if (ctl.size.load() != static_cast<uint64_t>(size) ||
        ctl.slot_bytes.load() != opts.slot_bytes ||
        ctl.channel_bytes.load() != opts.channel_bytes) {
      throw CommError(who + " failed: rank 0 created the segment for world size " +
                      std::to_string(ctl.size.load()) + ", slot_bytes " +
                      std::to_string(ctl.slot_bytes.load()) + ", channel_bytes " +
                      std::to_string(ctl.channel_bytes.load()) +
                      ": every rank must pass the same world size and Options");
    }
  }
  auto comm = std::make_unique<ShmCommImpl>(name, rank, size, opts, std::move(mapping), layout);
  comm->attach(deadline);
  return comm;
}

ShmCommImpl::ShmCommImpl(std::string name, int rank, int size, const Options& opts,
                         shm::Mapping mapping, const shm::Layout& layout)
    : ShmComm(rank, size, opts),
      name_(std::move(name)),
      mapping_(std::move(mapping)),
      base_(mapping_.base()),
      layout_(layout),
      inputs_(static_cast<size_t>(size)),
      pending_(static_cast<size_t>(size)),
      recv_mu_(new std::mutex[static_cast<size_t>(size)]),
      send_mu_(new std::mutex[static_cast<size_t>(size)]),
      queued_(new std::atomic<uint64_t>[static_cast<size_t>(size)]()) {}

ShmCommImpl::~ShmCommImpl() {
  if (!attached_) return;
  block(rank_).state.store(shm::kLeft, std::memory_order_seq_cst);
  shm::futex_wake_all(ctl().coll);
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    shm::futex_wake_all(channel(rank_, p).futex);
    shm::futex_wake_all(channel(p, rank_).futex);
  }
}

void ShmCommImpl::attach(shm::Clock::time_point deadline) {
  const std::string who = prefix("join (segment " + name_ + ")");
  shm::RankBlock& me = block(rank_);
  me.pid.store(static_cast<int32_t>(getpid()), std::memory_order_relaxed);
  uint32_t absent = shm::kAbsent;
  if (!me.state.compare_exchange_strong(absent, shm::kJoined)) {
    throw CommError(who + " failed: rank " + std::to_string(rank_) +
                    " has already joined this segment: two processes were given the same rank");
  }
  attached_ = true;
  shm::Control& c = ctl();
  c.joined.fetch_add(1, std::memory_order_seq_cst);
  shm::futex_wake_all(c.coll);
  for (;;) {
    c.coll.waiters.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t seen = c.coll.word.load(std::memory_order_seq_cst);
    const bool all = c.joined.load(std::memory_order_seq_cst) >= static_cast<uint32_t>(size_);
    if (!all) {
      shm::futex_sleep(c.coll, seen,
                       std::min<std::chrono::nanoseconds>(std::chrono::milliseconds(100),
                                                          deadline - shm::Clock::now()));
    }
    c.coll.waiters.fetch_sub(1, std::memory_order_seq_cst);
    if (all || c.joined.load(std::memory_order_seq_cst) >= static_cast<uint32_t>(size_)) break;
    if (shm::Clock::now() >= deadline) {
      std::vector<int> missing;
      for (int p = 0; p < size_; ++p) {
        if (block(p).state.load() == shm::kAbsent) missing.push_back(p);
      }
      shm::segment_unlink(name_);
      throw CommError(who + " timed out after " + std::to_string(opts_.timeout.count()) +
                      " ms: " + rank_list(missing) +
                      " never joined; check that every rank of the group starts and joins with "
                      "the same name and world size");
    }
  }
  // NOTE: every rank unlinks (ENOENT is fine): whichever rank survives longest, the name is gone
  // as soon as all have attached.
  shm::segment_unlink(name_);
}

// --- failures ----------------------------------------------------------------------------------

std::string ShmCommImpl::prefix(const std::string& op) const {
  return "neuron collectives: " + op + " on group '" + opts_.group_name + "' (rank " +
         std::to_string(rank_) + " of " + std::to_string(size_) + ")";
}

void ShmCommImpl::fail(const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(error_mu_);
    if (first_error_.empty()) first_error_ = message;
  }
  poisoned_.store(true, std::memory_order_seq_cst);
  shm::Control& c = ctl();
  uint32_t none = 0;
  if (c.abort_state.compare_exchange_strong(none, 1)) {
    c.abort_rank.store(rank_, std::memory_order_relaxed);
    const size_t n = std::min(message.size(), shm::kAbortMessageBytes - 1);
    std::memcpy(c.abort_message, message.data(), n);
    c.abort_message[n] = '\0';
    c.abort_state.store(2, std::memory_order_release);
  }
  shm::futex_wake_all(c.coll);
  for (int s = 0; s < size_; ++s) {
    for (int r = 0; r < size_; ++r) {
      if (s != r) shm::futex_wake_all(channel(s, r).futex);
    }
  }
  throw CommError(message);
}

void ShmCommImpl::check_usable(const std::string& op) {
  if (poisoned_.load(std::memory_order_seq_cst)) {
    std::string first;
    {
      std::lock_guard<std::mutex> lock(error_mu_);
      first = first_error_;
    }
    throw CommError(prefix(op) + " cannot run: this communicator failed earlier (" + first +
                    "); destroy the process group and create a new one");
  }
  const std::string why = wait_failure({}, "", timeout(), false, false);
  if (!why.empty()) fail(prefix(op) + why);
}

std::string ShmCommImpl::wait_failure(const std::vector<int>& peers, const char* hint,
                                      std::chrono::milliseconds timeout, bool timed_out,
                                      bool check_processes) const {
  shm::Control& c = ctl();
  uint32_t state = c.abort_state.load(std::memory_order_acquire);
  for (int i = 0; state == 1 && i < 1000; ++i) {  // its message is a memcpy away
    shm::Spinner(std::chrono::microseconds(0)).step();
    state = c.abort_state.load(std::memory_order_acquire);
  }
  if (state == 2 && c.abort_rank.load(std::memory_order_relaxed) != rank_) {
    return " failed because rank " + std::to_string(c.abort_rank.load()) +
           " failed first: " + std::string(c.abort_message);
  }
  if (state == 1) return " failed because another rank failed first";
  auto who = [&](int p) {
    return "rank " + std::to_string(p) + " (pid " + std::to_string(block(p).pid.load()) + ")";
  };
  for (int p : peers) {
    if (block(p).state.load(std::memory_order_seq_cst) == shm::kLeft) {
      return " failed: " + who(p) +
             " destroyed its communicator without making this call; check that every rank "
             "makes the same calls before destroying the process group";
    }
  }
  if (check_processes) {
    for (int p : peers) {
      if (shm::process_exited(block(p).pid.load())) {
        return " failed: " + who(p) +
               " exited or was killed while this rank waited for it; the group cannot "
               "continue: re-create it, and check that process's output for why it died";
      }
    }
  }
  if (!timed_out) return "";
  std::string waiting;
  for (size_t i = 0; i < peers.size(); ++i) waiting += (i ? ", " : "") + who(peers[i]);
  return " timed out after " + std::to_string(timeout.count()) + " ms waiting for " + waiting +
         (peers.size() == 1 ? ": the peer is alive but " : ": the peers are alive but ") + hint;
}

// --- steps -------------------------------------------------------------------------------------

void ShmCommImpl::begin(const Call& call) {
  check_usable(call_op_name(call.op));
  call_ = call;
  ++seq_;
  std::atomic<uint64_t>* d = block(rank_).desc[seq_ & 1];
  d[0].store(seq_, std::memory_order_relaxed);
  d[1].store(call.packed(), std::memory_order_relaxed);
  d[2].store(call.count, std::memory_order_relaxed);
  first_step_ = true;
}

void ShmCommImpl::step() {
  ++step_;
  const uint64_t s = step_;
  // NOTE: seq_cst pairs with the seq_cst waiter registration and loads in wait_until().
  block(rank_).arrived.store(s, std::memory_order_seq_cst);
  shm::futex_wake_all(ctl().coll);
  auto ready = [&] {
    for (int p = 0; p < size_; ++p) {
      if (block(p).arrived.load(std::memory_order_seq_cst) < s) return false;
    }
    return true;
  };
  auto blame = [&] {
    std::vector<int> late;
    for (int p = 0; p < size_; ++p) {
      if (block(p).arrived.load(std::memory_order_seq_cst) < s) late.push_back(p);
    }
    return late;
  };
  wait_until(
      ctl().coll, ready, blame, [&] { return std::string(call_op_name(call_.op)); }, kCallHint);
  if (first_step_) {
    first_step_ = false;
    check_calls();
  }
}

void ShmCommImpl::check_calls() {
  std::vector<Call> calls(static_cast<size_t>(size_));
  std::vector<uint64_t> seqs(static_cast<size_t>(size_));
  bool same = true;
  for (int p = 0; p < size_; ++p) {
    const std::atomic<uint64_t>* d = block(p).desc[seq_ & 1];
    seqs[p] = d[0].load(std::memory_order_relaxed);
    calls[p] = Call::unpack(d[1].load(std::memory_order_relaxed), d[2].load());
    same = same && seqs[p] == seq_ && calls[p] == calls[0];
  }
  if (same) return;
  // Every rank reads the same descriptors, so every rank raises the same message.
  std::string what;
  std::vector<bool> done(static_cast<size_t>(size_));
  for (int p = 0; p < size_; ++p) {
    if (done[p]) continue;
    std::vector<int> group;
    for (int q = p; q < size_; ++q) {
      if (!done[q] && seqs[q] == seqs[p] && calls[q] == calls[p]) {
        group.push_back(q);
        done[q] = true;
      }
    }
    what += (what.empty() ? "" : ", ") + rank_list(group) + " called " + calls[p].describe();
    if (seqs[p] != seq_) what += " as call #" + std::to_string(seqs[p]);
  }
  fail(prefix(call_op_name(call_.op)) + ": mismatched collectives at call #" +
       std::to_string(seq_) + ": " + what +
       "; every rank must make the same collective calls in the same order, with the same "
       "sizes, dtypes, reduce ops and roots");
}

std::atomic<uint64_t>& ShmCommImpl::a2a_word(uint64_t seq, int sender, int kind, int peer) const {
  const size_t n = static_cast<size_t>(size_);
  const size_t i = (((seq & 1) * n + static_cast<size_t>(sender)) * 2 + kind) * n + peer;
  return reinterpret_cast<std::atomic<uint64_t>*>(base_ + layout_.a2a)[i];
}

void ShmCommImpl::check_reduce_args(const char* op, DType dt, ReduceOp red) const {
  if (!reduce_op_valid(dt, red)) {
    throw CommError(prefix(op) + ": reduce op " + reduce_op_name(red) + " is not defined for " +
                    dtype_name(dt) + "; bitwise ops take integer and bool dtypes");
  }
}

void ShmCommImpl::check_root(const char* op, int root) const {
  if (root < 0 || root >= size_) {
    throw CommError(prefix(op) + ": root " + std::to_string(root) +
                    " is not a rank of the group (0.." + std::to_string(size_ - 1) + ")");
  }
}

// --- reductions --------------------------------------------------------------------------------

void ShmCommImpl::reduce_slots(void* dst, size_t first, size_t n, size_t elem_offset_bytes,
                               DType dt, ReduceOp op) {
  const size_t es = dtype_size(dt);
  for (int p = 0; p < size_; ++p) inputs_[p] = slot(p) + elem_offset_bytes + first * es;
  reduce_many(dst, inputs_.data(), size_, n, dt, op);
}

size_t ShmCommImpl::step_bytes() const { return std::min(layout_.half, kStepBytes); }

void ShmCommImpl::all_reduce(const void* in, void* out, size_t count, DType dt, ReduceOp op) {
  check_reduce_args("all_reduce", dt, op);
  if (size_ == 1) {
    check_usable("all_reduce");
    if (in != out) std::memmove(out, in, count * dtype_size(dt));
    return;
  }
  begin({CallOp::kAllReduce, count, static_cast<int>(dt), static_cast<int>(op), -1});
  reduce_impl(static_cast<const uint8_t*>(in), static_cast<uint8_t*>(out), count, dt, op, -1);
}

void ShmCommImpl::reduce(const void* in, void* out, size_t count, DType dt, ReduceOp op, int root) {
  check_reduce_args("reduce", dt, op);
  check_root("reduce", root);
  begin({CallOp::kReduce, count, static_cast<int>(dt), static_cast<int>(op), root});
  reduce_impl(static_cast<const uint8_t*>(in), static_cast<uint8_t*>(out), count, dt, op, root);
}

void ShmCommImpl::reduce_impl(const uint8_t* in, uint8_t* out, size_t count, DType dt, ReduceOp op,
                              int root) {
  const size_t es = dtype_size(dt);
  const bool wants = root < 0 || root == rank_;
  if (count * es <= std::min(kDirectBytes, layout_.half)) {
    std::memcpy(slot(rank_), in, count * es);
    step();
    if (wants) reduce_slots(out, 0, count, 0, dt, op);
    next_half();
    return;
  }
  // Chunks: each rank stages the portions of the chunk the other ranks reduce; rank r reduces
  // its 1/size portion (its own input read in place, the others' from their slots, in rank
  // order) into its slot; then every rank (or the root) copies all portions out.
  const size_t chunk = step_bytes() / es;
  auto portion = [&](int p, size_t n) { return n * static_cast<size_t>(p) / size_; };
  for (size_t off = 0; off < count; off += chunk) {
    const size_t n = std::min(chunk, count - off);
    for (int q = 0; q < size_; ++q) {
      const size_t qlo = portion(q, n), qhi = portion(q + 1, n);
      if (q != rank_) std::memcpy(slot(rank_) + qlo * es, in + (off + qlo) * es, (qhi - qlo) * es);
    }
    step();
    const size_t lo = portion(rank_, n), hi = portion(rank_ + 1, n);
    for (int p = 0; p < size_; ++p) {
      inputs_[p] = p == rank_ ? in + (off + lo) * es : slot(p) + lo * es;
    }
    reduce_many(slot(rank_) + lo * es, inputs_.data(), size_, hi - lo, dt, op);
    step();
    if (wants) {
      for (int p = 0; p < size_; ++p) {
        const size_t plo = portion(p, n), phi = portion(p + 1, n);
        std::memcpy(out + (off + plo) * es, slot(p) + plo * es, (phi - plo) * es);
      }
    }
    next_half();
  }
}

void ShmCommImpl::reduce_scatter(const void* in, void* out, size_t count, DType dt, ReduceOp op) {
  check_reduce_args("reduce_scatter", dt, op);
  begin({CallOp::kReduceScatter, count, static_cast<int>(dt), static_cast<int>(op), -1});
  const size_t es = dtype_size(dt);
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  // Per step, each rank stages `chunk` elements of every block; rank r reduces block r.
  const size_t chunk = step_bytes() / (es * size_);
  const size_t steps = chunks_of(count, chunk);
  for (size_t c = 0; c < steps; ++c) {
    const size_t off = c * chunk, n = std::min(chunk, count - off);
    for (int q = 0; q < size_; ++q) {
      std::memcpy(slot(rank_) + q * n * es, src + (q * count + off) * es, n * es);
    }
    step();
    reduce_slots(dst + off * es, 0, n, rank_ * n * es, dt, op);
    next_half();
  }
}

// --- data movement -----------------------------------------------------------------------------

void ShmCommImpl::broadcast(void* buf, size_t bytes, int root) {
  check_root("broadcast", root);
  begin({CallOp::kBroadcast, bytes, -1, -1, root});
  auto* data = static_cast<uint8_t*>(buf);
  const size_t steps = chunks_of(bytes, step_bytes());
  for (size_t c = 0; c < steps; ++c) {
    const size_t off = c * step_bytes(), n = std::min(step_bytes(), bytes - off);
    if (rank_ == root) std::memcpy(slot(root), data + off, n);
    step();
    if (rank_ != root) std::memcpy(data + off, slot(root), n);
    next_half();
  }
}

void ShmCommImpl::all_gather(const void* in, void* out, size_t bytes) {
  begin({CallOp::kAllGather, bytes, -1, -1, -1});
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  const bool in_place = src == dst + rank_ * bytes;
  const size_t steps = chunks_of(bytes, step_bytes());
  for (size_t c = 0; c < steps; ++c) {
    const size_t off = c * step_bytes(), n = std::min(step_bytes(), bytes - off);
    std::memcpy(slot(rank_), src + off, n);
    step();
    for (int p = 0; p < size_; ++p) {
      if (p != rank_ || !in_place) std::memcpy(dst + p * bytes + off, slot(p), n);
    }
    next_half();
  }
}

void ShmCommImpl::gather(const void* in, void* out, size_t bytes, int root) {
  check_root("gather", root);
  begin({CallOp::kGather, bytes, -1, -1, root});
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  const size_t steps = chunks_of(bytes, step_bytes());
  for (size_t c = 0; c < steps; ++c) {
    const size_t off = c * step_bytes(), n = std::min(step_bytes(), bytes - off);
    std::memcpy(slot(rank_), src + off, n);
    step();
    if (rank_ == root) {
      for (int p = 0; p < size_; ++p) std::memmove(dst + p * bytes + off, slot(p), n);
    }
    next_half();
  }
}

void ShmCommImpl::scatter(const void* in, void* out, size_t bytes, int root) {
  check_root("scatter", root);
  begin({CallOp::kScatter, bytes, -1, -1, root});
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  const size_t chunk = step_bytes() / size_;
  const size_t steps = chunks_of(bytes, chunk);
  for (size_t c = 0; c < steps; ++c) {
    const size_t off = c * chunk, n = std::min(chunk, bytes - off);
    if (rank_ == root) {
      for (int q = 0; q < size_; ++q) std::memcpy(slot(root) + q * n, src + q * bytes + off, n);
    }
    step();
    std::memmove(dst + off, slot(root) + rank_ * n, n);
    next_half();
  }
}

void ShmCommImpl::check_all_to_all_sizes(uint64_t* max_bytes) {
  *max_bytes = 0;
  std::string what;
  for (int p = 0; p < size_; ++p) {
    for (int q = 0; q < size_; ++q) {
      const uint64_t sends = a2a_word(seq_, p, 0, q).load(std::memory_order_relaxed);
      const uint64_t expects = a2a_word(seq_, q, 1, p).load(std::memory_order_relaxed);
      *max_bytes = std::max(*max_bytes, sends);
      if (sends != expects && what.size() < 400) {
        what += (what.empty() ? "" : ", ") + std::string("rank ") + std::to_string(p) + " sends " +
                std::to_string(sends) + " bytes to rank " + std::to_string(q) + ", which expects " +
                std::to_string(expects);
      }
    }
  }
  if (!what.empty()) {
    fail(prefix("all_to_all") + ": mismatched sizes at call #" + std::to_string(seq_) + ": " +
         what + "; each rank's send_bytes[p] must equal rank p's recv_bytes[sender]");
  }
}

void ShmCommImpl::all_to_all(const void* in, const size_t* send_offsets, const size_t* send_bytes,
                             void* out, const size_t* recv_offsets, const size_t* recv_bytes) {
  begin({CallOp::kAllToAll, 0, -1, -1, -1});
  for (int q = 0; q < size_; ++q) {
    a2a_word(seq_, rank_, 0, q).store(send_bytes[q], std::memory_order_relaxed);
    a2a_word(seq_, rank_, 1, q).store(recv_bytes[q], std::memory_order_relaxed);
  }
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  // Per step, rank r's slot carries the next `piece` bytes of its message to each rank q at
  // q * piece; the first pieces go with the step that exchanges the sizes.
  const size_t piece = step_bytes() / size_;
  auto stage = [&](size_t off) {
    for (int q = 0; q < size_; ++q) {
      if (off < send_bytes[q]) {
        std::memcpy(slot(rank_) + q * piece, src + send_offsets[q] + off,
                    std::min(piece, send_bytes[q] - off));
      }
    }
  };
  stage(0);
  step();
  uint64_t max_bytes = 0;
  check_all_to_all_sizes(&max_bytes);
  const size_t steps = chunks_of(max_bytes, piece);
  for (size_t c = 0; c < steps; ++c) {
    const size_t off = c * piece;
    if (c > 0) {
      stage(off);
      step();
    }
    for (int p = 0; p < size_; ++p) {
      if (off < recv_bytes[p]) {
        std::memcpy(dst + recv_offsets[p] + off, slot(p) + rank_ * piece,
                    std::min(piece, recv_bytes[p] - off));
      }
    }
    next_half();
  }
}

void ShmCommImpl::barrier() {
  begin({CallOp::kBarrier, 0, -1, -1, -1});
  step();
  next_half();
}

}  // namespace openneuron::collectives
