// Collectives among the ranks of one group on one host, over one shared-memory segment
// (DESIGN §7). Torch-free: raw pointers, byte counts and element counts; the c10d glue
// (csrc/aten/distributed/) maps tensors, streams and Work onto it, and the inter-host leg
// (Gloo) onto a ShmComm per host. Every call is collective: each rank of the group makes the
// same calls in the same order (a mismatch in op, size, dtype or root is a CommError on every
// rank, never corruption). Collectives on one ShmComm come from one thread at a time (the
// group's communication thread); send/recv use per-pair channels apart from the collectives'
// slots and may run concurrently with them and each other, one thread at a time per (peer,
// direction). Different ShmComms are independent. No busy spin: waits spin briefly, then sleep
// on a futex in the segment; they notice a peer process that has exited within ~100 ms.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

namespace openneuron::collectives {

// Element types of collectives (torch's names in comments). bf16/f16 reduce in float32 and
// round once; integer overflow wraps as in two's complement.
enum class DType : uint8_t {
  kFloat32,   // float32
  kFloat64,   // float64
  kBFloat16,  // bfloat16
  kFloat16,   // float16
  kInt8,      // int8
  kUInt8,     // uint8
  kInt16,     // int16
  kInt32,     // int32
  kInt64,     // int64
  kBool,      // bool (1 byte; SUM/MAX = or, PRODUCT/MIN = and)
};
size_t dtype_size(DType dt);
const char* dtype_name(DType dt);  // "float32", ...

// AVG and PREMUL_SUM are the glue's: it scales before (PREMUL_SUM) or after (AVG) a kSum.
// Bitwise ops take integer and bool dtypes only.
enum class ReduceOp : uint8_t { kSum, kProduct, kMin, kMax, kBand, kBor, kBxor };
const char* reduce_op_name(ReduceOp op);  // "SUM", ...

// A collective that failed on this rank: a peer exited, was killed or did not arrive within
// the timeout, or the ranks disagree on the call. what() names the collective, the group
// (Options::group_name), this rank and the peer, and what to check.
class CommError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Options {
  std::string group_name = "default";  // for messages
  // How long any wait inside a call (collective, send or recv) may go without the peers it
  // waits for making progress; a large collective may take longer in all.
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};
  // Per-rank staging area, split in two halves that alternate between calls; messages larger
  // than a half go in chunks. At least 128 * size.
  size_t slot_bytes = 4 << 20;
  // Ring per ordered pair of ranks for send/recv; larger messages stream through it.
  size_t channel_bytes = 1 << 20;
};

class ShmComm {
 public:
  // Joins the segment `name` (a POSIX shm name, "/openneuron-..."): rank 0 creates it
  // (owner-only, O_EXCL), the others open it, and once all `size` ranks have attached it is
  // unlinked (by every rank; the first wins), so no name outlives the group even if a rank is
  // killed later. Returns when every rank has joined; CommError after opts.timeout (naming the
  // ranks that never came). Every rank must pass the same size and Options sizes.
  // The glue agrees on `name` through the c10d store; tests pass it directly.
  static std::unique_ptr<ShmComm> join(const std::string& name, int rank, int size,
                                       const Options& opts);
  // Never blocks: peers still waiting for this rank fail at once ("destroyed its
  // communicator"). Fine after a failure.
  virtual ~ShmComm() = default;
  ShmComm(const ShmComm&) = delete;
  ShmComm& operator=(const ShmComm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // The options given to join(); the timeout in force is timeout(), not options().timeout.
  const Options& options() const { return opts_; }
  // The timeout of the waits of calls from now on (opts.timeout until set_timeout). Thread-safe.
  std::chrono::milliseconds timeout() const {
    return std::chrono::milliseconds(timeout_ms_.load(std::memory_order_relaxed));
  }
  // Changes the timeout from the next call on. Thread-safe: the glue sets it before each call,
  // from the collectives thread and the send/recv threads alike.
  void set_timeout(std::chrono::milliseconds t) {
    timeout_ms_.store(t.count(), std::memory_order_relaxed);
  }

  // in == out allowed (in place) unless noted. counts are elements, bytes are bytes.
  // After any CommError the ShmComm is poisoned: every later call raises at once, and the peers'
  // calls fail fast too (the group must be re-created).
  virtual void all_reduce(const void* in, void* out, size_t count, DType dt, ReduceOp op) = 0;
  virtual void reduce(const void* in, void* out, size_t count, DType dt, ReduceOp op,
                      int root) = 0;  // out used on root only
  virtual void broadcast(void* buf, size_t bytes, int root) = 0;
  // out: size * bytes, rank r's block at r * bytes; in may be out + rank * bytes (in place).
  virtual void all_gather(const void* in, void* out, size_t bytes) = 0;
  // in: size * count elements, block r to rank r; out: count elements (may alias block rank).
  virtual void reduce_scatter(const void* in, void* out, size_t count, DType dt, ReduceOp op) = 0;
  // Uneven all-to-all: this rank sends send_bytes[p] bytes from in + send_offsets[p] to each
  // peer p and receives recv_bytes[p] bytes into out + recv_offsets[p] (arrays of size()).
  // Each pair must agree (my send_bytes[p] == p's recv_bytes[me]), else CommError on every
  // rank. in and out must not overlap.
  virtual void all_to_all(const void* in, const size_t* send_offsets, const size_t* send_bytes,
                          void* out, const size_t* recv_offsets, const size_t* recv_bytes) = 0;
  // gather: out (size * bytes, on root only) gets rank r's in at r * bytes; in may be
  // out + root * bytes on root. scatter: rank r gets in + r * bytes (in: on root only); out may
  // be in + root * bytes on root.
  virtual void gather(const void* in, void* out, size_t bytes, int root) = 0;
  virtual void scatter(const void* in, void* out, size_t bytes, int root) = 0;
  virtual void barrier() = 0;
  // Point to point, matched FIFO per (sender, receiver, tag); sizes must agree. send returns
  // once the data is out of `buf`: at once for messages that fit the pair's channel, else as
  // the receiver drains it (so opposite sends of large messages need separate threads). A
  // recv that meets a message for another tag copies it aside (private memory) and reads on.
  // peer must be another rank.
  virtual void send(const void* buf, size_t bytes, int peer, int tag) = 0;
  virtual void recv(void* buf, size_t bytes, int peer, int tag) = 0;

 protected:
  ShmComm(int rank, int size, const Options& opts)
      : rank_(rank), size_(size), opts_(opts), timeout_ms_(opts.timeout.count()) {}
  int rank_;
  int size_;
  Options opts_;  // as given to join(); never changes
  std::atomic<int64_t> timeout_ms_;
};

// Reduces n elements of b into a (a = a op b), in float32 for bf16/f16 (rounded once per call).
// MIN/MAX propagate NaN. a == b is allowed, partial overlap is not. Throws
// std::invalid_argument for a bitwise op on a floating dtype. Exposed for the inter-host leg
// and tests. Thread-safe.
void reduce_into(void* a, const void* b, size_t n, DType dt, ReduceOp op);

}  // namespace openneuron::collectives
