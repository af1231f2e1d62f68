// gtests for the shared-memory collectives (csrc/collectives/shm_comm.h): threads as ranks, each
// joining one fresh segment; every collective, dtype and reduce op against a serial reference
// (bitwise: the algorithms reduce in rank order, bf16/f16 in float32 rounded once), send/recv
// tag matching, and the failures a user meets: mismatched calls, a timeout, a peer that left,
// a peer process that exited or was killed. Small slot and channel sizes force chunking.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "collectives/shm_comm.h"
#include "ir/dtype.h"

namespace openneuron::collectives {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using Bytes = std::vector<uint8_t>;
namespace num = ir::numeric;

constexpr DType kDTypes[] = {DType::kFloat32, DType::kFloat64, DType::kBFloat16, DType::kFloat16,
                             DType::kInt8,    DType::kUInt8,   DType::kInt16,    DType::kInt32,
                             DType::kInt64,   DType::kBool};
constexpr ReduceOp kOps[] = {ReduceOp::kSum,  ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax,
                             ReduceOp::kBand, ReduceOp::kBor,     ReduceOp::kBxor};

std::string segment_prefix() { return "openneuron-test-" + std::to_string(getpid()) + "-"; }

std::string unique_name() {
  static std::atomic<int> counter{0};
  return "/" + segment_prefix() + std::to_string(counter++);
}

// /dev/shm entries this process created and left behind.
std::vector<std::string> leftover_segments() {
  std::vector<std::string> found;
  DIR* d = opendir("/dev/shm");
  if (d == nullptr) return found;
  while (dirent* e = readdir(d)) {
    if (std::string(e->d_name).rfind(segment_prefix(), 0) == 0) found.push_back(e->d_name);
  }
  closedir(d);
  return found;
}

Options test_options(std::chrono::milliseconds timeout = 10s) {
  Options o;
  o.group_name = "test";
  o.timeout = timeout;
  o.slot_bytes = 4 << 10;  // 2 KiB halves: most sizes below go in chunks
  o.channel_bytes = 4 << 10;
  return o;
}

// Runs fn(comm) on `size` threads, one per rank, all joined to one fresh segment; returns each
// rank's CommError message ("" if none).
std::vector<std::string> run_ranks(int size, const Options& opts,
                                   const std::function<void(ShmComm&)>& fn) {
  const std::string name = unique_name();
  std::vector<std::string> errors(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto comm = ShmComm::join(name, r, size, opts);
        fn(*comm);
      } catch (const CommError& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

void expect_no_errors(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

class Collectives : public ::testing::Test {
 protected:
  void TearDown() override { EXPECT_EQ(leftover_segments(), std::vector<std::string>{}); }
};
using CollectivesFailures = Collectives;

// --- inputs and the serial reference ----------------------------------------------------------

uint64_t mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Element i of rank r's input for case `seed`: random bits, floats in [-4, 4) with a full
// mantissa (so a different summation order shows), bool 0/1.
Bytes make_input(DType dt, size_t count, uint64_t seed, int rank) {
  Bytes b(count * dtype_size(dt));
  for (size_t i = 0; i < count; ++i) {
    const uint64_t h = mix(seed * 1000003 + static_cast<uint64_t>(rank) * 7919 + i);
    const float f = (static_cast<float>(h >> 40) / 16777216.0f - 0.5f) * 8.0f;
    uint8_t* p = b.data() + i * dtype_size(dt);
    switch (dt) {
      case DType::kFloat32:
        std::memcpy(p, &f, 4);
        break;
      case DType::kFloat64: {
        const double d = (static_cast<double>(h >> 11) / 9007199254740992.0 - 0.5) * 8.0;
        std::memcpy(p, &d, 8);
        break;
      }
      case DType::kBFloat16: {
        const uint16_t v = num::bf16_from_f32(f);
        std::memcpy(p, &v, 2);
        break;
      }
      case DType::kFloat16: {
        const uint16_t v = num::f16_from_f32(f);
        std::memcpy(p, &v, 2);
        break;
      }
      case DType::kBool:
        *p = h & 1;
        break;
      default:
        std::memcpy(p, &h, dtype_size(dt));
    }
  }
  return b;
}

template <class T>
T ref_combine(ReduceOp op, T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    switch (op) {
      case ReduceOp::kSum:
        return a + b;
      case ReduceOp::kProduct:
        return a * b;
      case ReduceOp::kMin:
        return std::min(a, b);
      default:
        return std::max(a, b);
    }
  } else {
    const uint64_t x = static_cast<uint64_t>(a), y = static_cast<uint64_t>(b);
    switch (op) {
      case ReduceOp::kSum:
        return static_cast<T>(x + y);
      case ReduceOp::kProduct:
        return static_cast<T>(x * y);
      case ReduceOp::kMin:
        return std::min(a, b);
      case ReduceOp::kMax:
        return std::max(a, b);
      case ReduceOp::kBand:
        return static_cast<T>(x & y);
      case ReduceOp::kBor:
        return static_cast<T>(x | y);
      case ReduceOp::kBxor:
        return static_cast<T>(x ^ y);
    }
    return a;
  }
}

// Storage type S, accumulated as A (float for bf16/f16) in rank order, converted back once.
template <class S, class A>
void ref_reduce(const std::vector<Bytes>& inputs, ReduceOp op, size_t first, size_t n, uint8_t* out,
                A (*load)(S), S (*store)(A)) {
  for (size_t i = 0; i < n; ++i) {
    S v;
    std::memcpy(&v, inputs[0].data() + (first + i) * sizeof(S), sizeof(S));
    A acc = load(v);
    for (size_t r = 1; r < inputs.size(); ++r) {
      std::memcpy(&v, inputs[r].data() + (first + i) * sizeof(S), sizeof(S));
      acc = ref_combine<A>(op, acc, load(v));
    }
    const S s = store(acc);
    std::memcpy(out + i * sizeof(S), &s, sizeof(S));
  }
}

template <class T>
T same(T v) {
  return v;
}
uint8_t to_bool(uint8_t v) { return v != 0; }
uint8_t bool_op_result(ReduceOp op, uint8_t a, uint8_t b) {
  if (op == ReduceOp::kSum || op == ReduceOp::kMax || op == ReduceOp::kBor) return a | b;
  if (op == ReduceOp::kBxor) return a ^ b;
  return a & b;
}

// The reduction of elements [first, first + n) of every rank's input.
Bytes reference(const std::vector<Bytes>& inputs, DType dt, ReduceOp op, size_t first, size_t n) {
  Bytes out(n * dtype_size(dt));
  switch (dt) {
    case DType::kFloat32:
      ref_reduce<float, float>(inputs, op, first, n, out.data(), same, same);
      break;
    case DType::kFloat64:
      ref_reduce<double, double>(inputs, op, first, n, out.data(), same, same);
      break;
    case DType::kBFloat16:
      ref_reduce<uint16_t, float>(
          inputs, op, first, n, out.data(), [](uint16_t h) { return num::f32_from_bf16(h); },
          [](float f) { return num::bf16_from_f32(f); });
      break;
    case DType::kFloat16:
      ref_reduce<uint16_t, float>(
          inputs, op, first, n, out.data(), [](uint16_t h) { return num::f32_from_f16(h); },
          [](float f) { return num::f16_from_f32(f); });
      break;
    case DType::kInt8:
      ref_reduce<int8_t, int8_t>(inputs, op, first, n, out.data(), same, same);
      break;
    case DType::kUInt8:
      ref_reduce<uint8_t, uint8_t>(inputs, op, first, n, out.data(), same, same);
      break;
    case DType::kInt16:
      ref_reduce<int16_t, int16_t>(inputs, op, first, n, out.data(), same, same);
      break;
    case DType::kInt32:
      ref_reduce<int32_t, int32_t>(inputs, op, first, n, out.data(), same, same);
      break;
    case DType::kInt64:
      ref_reduce<int64_t, int64_t>(inputs, op, first, n, out.data(), same, same);
      break;
    case DType::kBool:
      for (size_t i = 0; i < n; ++i) {
        uint8_t acc = to_bool(inputs[0][first + i]);
        for (size_t r = 1; r < inputs.size(); ++r) {
          acc = bool_op_result(op, acc, to_bool(inputs[r][first + i]));
        }
        out[i] = acc;
      }
      break;
  }
  return out;
}

bool is_floating(DType dt) {
  return dt == DType::kFloat32 || dt == DType::kFloat64 || dt == DType::kBFloat16 ||
         dt == DType::kFloat16;
}
bool is_bitwise(ReduceOp op) {
  return op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor;
}

std::string case_name(DType dt, ReduceOp op, size_t count, bool in_place) {
  return std::string(dtype_name(dt)) + " " + reduce_op_name(op) +
         " count=" + std::to_string(count) + (in_place ? " in place" : "");
}

// --- reductions -------------------------------------------------------------------------------

// all_reduce, reduce and reduce_scatter for every dtype, op and size on `world` ranks.
void check_reductions(int world) {
  const size_t counts[] = {0, 1, 3, 1001, 5003};
  expect_no_errors(run_ranks(world, test_options(), [&](ShmComm& c) {
    uint64_t seed = 0;
    for (DType dt : kDTypes) {
      for (ReduceOp op : kOps) {
        if (is_floating(dt) && is_bitwise(op)) continue;
        for (size_t count : counts) {
          ++seed;
          const bool in_place = seed % 2 == 0;
          const std::string what = case_name(dt, op, count, in_place);
          const size_t es = dtype_size(dt);
          std::vector<Bytes> inputs;
          for (int r = 0; r < world; ++r) inputs.push_back(make_input(dt, count, seed, r));
          const Bytes want = reference(inputs, dt, op, 0, count);

          Bytes buf = inputs[c.rank()], out(count * es);
          c.all_reduce(buf.data(), in_place ? buf.data() : out.data(), count, dt, op);
          EXPECT_EQ(in_place ? buf : out, want) << "all_reduce " << what;

          const int root = static_cast<int>(seed % world);
          buf = inputs[c.rank()];
          std::fill(out.begin(), out.end(), 0);
          c.reduce(buf.data(), in_place ? buf.data() : out.data(), count, dt, op, root);
          if (c.rank() == root) {
            EXPECT_EQ(in_place ? buf : out, want) << "reduce " << what;
          }

          std::vector<Bytes> blocks;
          for (int r = 0; r < world; ++r) blocks.push_back(make_input(dt, world * count, seed, r));
          const Bytes block_want = reference(blocks, dt, op, c.rank() * count, count);
          buf = blocks[c.rank()];
          uint8_t* dst = in_place ? buf.data() + c.rank() * count * es : out.data();
          c.reduce_scatter(buf.data(), dst, count, dt, op);
          EXPECT_EQ(Bytes(dst, dst + count * es), block_want) << "reduce_scatter " << what;
        }
      }
    }
  }));
}

TEST_F(Collectives, ReductionsOnOneRank) { check_reductions(1); }
TEST_F(Collectives, ReductionsOnTwoRanks) { check_reductions(2); }
TEST_F(Collectives, ReductionsOnThreeRanks) { check_reductions(3); }
TEST_F(Collectives, ReductionsOnFourRanks) { check_reductions(4); }

TEST_F(Collectives, ReduceIntoMatchesTheReferenceForEveryDtypeAndOp) {
  for (DType dt : kDTypes) {
    for (ReduceOp op : kOps) {
      std::vector<Bytes> inputs = {make_input(dt, 777, 5, 0), make_input(dt, 777, 5, 1)};
      if (is_floating(dt) && is_bitwise(op)) {
        EXPECT_THROW(reduce_into(inputs[0].data(), inputs[1].data(), 777, dt, op),
                     std::invalid_argument);
        continue;
      }
      const Bytes want = reference(inputs, dt, op, 0, 777);
      reduce_into(inputs[0].data(), inputs[1].data(), 777, dt, op);
      EXPECT_EQ(inputs[0], want) << case_name(dt, op, 777, false);
    }
  }
}

// --- data movement ----------------------------------------------------------------------------

Bytes pattern(size_t bytes, uint64_t seed, int from, int to = 0) {
  Bytes b(bytes);
  for (size_t i = 0; i < bytes; ++i)
    b[i] = static_cast<uint8_t>(mix(seed * 131 + from * 17 + to * 3 + i));
  return b;
}

void check_data_movement(int world) {
  const size_t sizes[] = {0, 1, 3, 2047, 2049, 9001};
  expect_no_errors(run_ranks(world, test_options(), [&](ShmComm& c) {
    const int me = c.rank();
    uint64_t seed = 0;
    for (size_t bytes : sizes) {
      ++seed;
      const bool in_place = seed % 2 == 0;
      const int root = static_cast<int>(seed % world);
      Bytes buf = me == root ? pattern(bytes, seed, root) : Bytes(bytes);
      c.broadcast(buf.data(), bytes, root);
      EXPECT_EQ(buf, pattern(bytes, seed, root)) << "broadcast bytes=" << bytes;

      Bytes all(world * bytes), want;
      for (int p = 0; p < world; ++p) {
        const Bytes b = pattern(bytes, seed, p);
        want.insert(want.end(), b.begin(), b.end());
      }
      const Bytes mine = pattern(bytes, seed, me);
      if (in_place) std::memcpy(all.data() + me * bytes, mine.data(), bytes);
      c.all_gather(in_place ? all.data() + me * bytes : mine.data(), all.data(), bytes);
      EXPECT_EQ(all, want) << "all_gather bytes=" << bytes;

      std::fill(all.begin(), all.end(), 0);
      if (in_place && me == root) std::memcpy(all.data() + me * bytes, mine.data(), bytes);
      c.gather(in_place && me == root ? all.data() + me * bytes : mine.data(), all.data(), bytes,
               root);
      if (me == root) {
        EXPECT_EQ(all, want) << "gather bytes=" << bytes;
      }

      Bytes src = me == root ? want : Bytes(world * bytes), out(bytes);
      uint8_t* dst = in_place && me == root ? src.data() + me * bytes : out.data();
      c.scatter(src.data(), dst, bytes, root);
      EXPECT_EQ(Bytes(dst, dst + bytes), mine) << "scatter bytes=" << bytes;
    }
  }));
}

TEST_F(Collectives, DataMovementOnOneRank) { check_data_movement(1); }
TEST_F(Collectives, DataMovementOnTwoRanks) { check_data_movement(2); }
TEST_F(Collectives, DataMovementOnThreeRanks) { check_data_movement(3); }
TEST_F(Collectives, DataMovementOnFourRanks) { check_data_movement(4); }

size_t a2a_bytes(uint64_t seed, int from, int to) {
  return (from + to) % 3 == 0 ? 0 : static_cast<size_t>(mix(seed + from * 10 + to) % 5000);
}

TEST_F(Collectives, AllToAllWithUnevenSizes) {
  for (int world = 1; world <= 4; ++world) {
    expect_no_errors(run_ranks(world, test_options(), [&](ShmComm& c) {
      const int me = c.rank();
      for (uint64_t seed = 1; seed <= 3; ++seed) {
        std::vector<size_t> so(world), sb(world), ro(world), rb(world);
        Bytes in, out;
        for (int p = 0; p < world; ++p) {
          so[p] = in.size();
          sb[p] = a2a_bytes(seed, me, p);
          const Bytes b = pattern(sb[p], seed, me, p);
          in.insert(in.end(), b.begin(), b.end());
          ro[p] = out.size() + 5;  // gaps between the blocks stay untouched
          rb[p] = a2a_bytes(seed, p, me);
          out.resize(ro[p] + rb[p]);
        }
        c.all_to_all(in.data(), so.data(), sb.data(), out.data(), ro.data(), rb.data());
        for (int p = 0; p < world; ++p) {
          EXPECT_EQ(Bytes(out.begin() + ro[p], out.begin() + ro[p] + rb[p]),
                    pattern(rb[p], seed, p, me))
              << "from rank " << p << " to rank " << me << " seed " << seed;
          EXPECT_EQ(out[ro[p] - 1], 0);
        }
      }
    }));
  }
}

TEST_F(Collectives, BarrierHoldsEveryRankUntilAllArrive) {
  std::atomic<int> arrived{0};
  constexpr int kWorld = 4, kRounds = 50;
  expect_no_errors(run_ranks(kWorld, test_options(), [&](ShmComm& c) {
    for (int i = 0; i < kRounds; ++i) {
      if (c.rank() == i % kWorld) std::this_thread::sleep_for(200us);
      arrived.fetch_add(1);
      c.barrier();
      EXPECT_GE(arrived.load(), (i + 1) * kWorld);
      c.barrier();
    }
  }));
}

// --- send/recv --------------------------------------------------------------------------------

TEST_F(Collectives, RecvMatchesByTagPastPendingMessages) {
  expect_no_errors(run_ranks(2, test_options(), [&](ShmComm& c) {
    const size_t sizes[] = {10, 20000, 3};  // tag 2 streams through the 4 KiB ring
    if (c.rank() == 0) {
      for (int tag = 1; tag <= 3; ++tag) {
        const Bytes b = pattern(sizes[tag - 1], 9, 0, tag);
        c.send(b.data(), b.size(), 1, tag);
      }
      const Bytes again = pattern(7, 10, 0, 1);  // FIFO within a tag
      c.send(again.data(), again.size(), 1, 1);
    } else {
      for (int tag = 3; tag >= 1; --tag) {
        Bytes b(sizes[tag - 1]);
        c.recv(b.data(), b.size(), 0, tag);
        EXPECT_EQ(b, pattern(sizes[tag - 1], 9, 0, tag)) << "tag " << tag;
      }
      Bytes b(7);
      c.recv(b.data(), 7, 0, 1);
      EXPECT_EQ(b, pattern(7, 10, 0, 1));
    }
  }));
}

TEST_F(Collectives, SendsAndRecvsOfSeveralTagsOnThreadsAtOnce) {
  // The c10d backend runs each (peer, tag) on its own thread: sends of several tags to one peer
  // share its ring, recvs of several tags from one peer share the channel and the queues.
  constexpr int kTags = 4, kRounds = 20;
  expect_no_errors(run_ranks(2, test_options(), [&](ShmComm& c) {
    std::vector<std::thread> threads;
    std::atomic<int> bad{0};
    for (int tag = 0; tag < kTags; ++tag) {
      threads.emplace_back([&, tag] {
        for (int i = 0; i < kRounds; ++i) {
          const size_t bytes = 100 + 3000 * tag + i;  // tags 2, 3 stream through the ring
          if (c.rank() == 0) {
            const Bytes b = pattern(bytes, i, tag, 0);
            c.send(b.data(), bytes, 1, tag);
          } else {
            Bytes got(bytes);
            c.recv(got.data(), bytes, 0, tag);
            if (got != pattern(bytes, i, tag, 0)) ++bad;
          }
        }
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(bad.load(), 0);
  }));
}

TEST_F(Collectives, SendRecvStreamsLargeMessagesBothWays) {
  expect_no_errors(run_ranks(3, test_options(), [&](ShmComm& c) {
    const int me = c.rank(), next = (me + 1) % 3, prev = (me + 2) % 3;
    for (int i = 0; i < 5; ++i) {
      const size_t bytes = 50000 + i * 333;
      const Bytes b = pattern(bytes, i, me, next);
      Bytes got(bytes);
      std::thread sender([&] { c.send(b.data(), bytes, next, i); });
      c.recv(got.data(), bytes, prev, i);
      sender.join();
      EXPECT_EQ(got, pattern(bytes, i, prev, me));
    }
  }));
}

TEST_F(Collectives, SendRecvRunConcurrentlyWithCollectives) {
  expect_no_errors(run_ranks(2, test_options(), [&](ShmComm& c) {
    const int peer = 1 - c.rank();
    std::string p2p_error;
    std::thread p2p([&] {
      try {
        for (int i = 0; i < 50; ++i) {
          c.set_timeout(10s);  // as the glue does before each call, from its own thread
          const Bytes b = pattern(300 + i, i, c.rank());
          Bytes got(300 + i);
          if (c.rank() == 0) {
            c.send(b.data(), b.size(), peer, 7);
            c.recv(got.data(), got.size(), peer, 7);
          } else {
            c.recv(got.data(), got.size(), peer, 7);
            c.send(b.data(), b.size(), peer, 7);
          }
          EXPECT_EQ(got, pattern(300 + i, i, peer));
        }
      } catch (const CommError& e) {
        p2p_error = e.what();
      }
    });
    for (int i = 0; i < 50; ++i) {
      c.set_timeout(10s);
      int32_t v = c.rank() + i, got = 0;
      c.all_reduce(&v, &got, 1, DType::kInt32, ReduceOp::kSum);
      EXPECT_EQ(got, 1 + 2 * i);
    }
    p2p.join();
    EXPECT_EQ(p2p_error, "");
  }));
}

TEST_F(CollectivesFailures, RecvOfTheWrongSizeFailsAndPoisonsTheGroup) {
  const auto errors = run_ranks(2, test_options(2s), [&](ShmComm& c) {
    Bytes b(12);
    if (c.rank() == 0) {
      c.send(b.data(), 10, 1, 4);
      std::this_thread::sleep_for(50ms);
      const auto t0 = Clock::now();
      EXPECT_THROW(c.barrier(), CommError);
      EXPECT_LT(Clock::now() - t0, 1s);
    } else {
      c.recv(b.data(), 12, 0, 4);
    }
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_NE(errors[1].find("rank 0 sent 10 bytes with tag 4 but this rank expects 12"),
            std::string::npos)
      << errors[1];
}

// --- mismatched calls, timeouts, peers gone ---------------------------------------------------

TEST_F(CollectivesFailures, MismatchedCountsFailOnEveryRank) {
  std::vector<std::string> later(2);
  const auto errors = run_ranks(2, test_options(), [&](ShmComm& c) {
    std::vector<float> v(12);
    try {
      c.all_reduce(v.data(), v.data(), c.rank() == 0 ? 10 : 12, DType::kFloat32, ReduceOp::kSum);
    } catch (const CommError&) {
      try {
        c.barrier();  // poisoned: raises at once
      } catch (const CommError& e) {
        later[c.rank()] = e.what();
      }
      throw;
    }
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("rank 0 called all_reduce(count=10, float32, SUM), rank 1 called "
                             "all_reduce(count=12, float32, SUM)"),
              std::string::npos)
        << errors[r];
    EXPECT_NE(errors[r].find("group 'test' (rank " + std::to_string(r) + " of 2)"),
              std::string::npos)
        << errors[r];
    EXPECT_NE(later[r].find("this communicator failed earlier"), std::string::npos) << later[r];
  }
}

TEST_F(CollectivesFailures, MismatchedOpsFailOnEveryRank) {
  const auto errors = run_ranks(3, test_options(), [&](ShmComm& c) {
    std::vector<float> v(10);
    if (c.rank() == 1) {
      c.broadcast(v.data(), 40, 0);
    } else {
      c.all_reduce(v.data(), v.data(), 10, DType::kFloat32, ReduceOp::kSum);
    }
  });
  for (const auto& e : errors) {
    EXPECT_NE(e.find("ranks 0, 2 called all_reduce(count=10, float32, SUM), rank 1 called "
                     "broadcast(bytes=40, root=0)"),
              std::string::npos)
        << e;
  }
}

TEST_F(CollectivesFailures, MismatchedAllToAllSizesFailOnEveryRank) {
  const auto errors = run_ranks(2, test_options(), [&](ShmComm& c) {
    Bytes in(100), out(100);
    const size_t offs[] = {0, 50}, sends[] = {10, 10};
    const size_t recvs[] = {10, c.rank() == 0 ? size_t{21} : size_t{10}};
    c.all_to_all(in.data(), offs, sends, out.data(), offs, recvs);
  });
  for (const auto& e : errors) {
    EXPECT_NE(e.find("rank 1 sends 10 bytes to rank 0, which expects 21"), std::string::npos) << e;
  }
}

TEST_F(CollectivesFailures, InvalidArgumentsFailWithoutPoisoning) {
  expect_no_errors(run_ranks(2, test_options(), [&](ShmComm& c) {
    float v = 1;
    EXPECT_THROW(c.all_reduce(&v, &v, 1, DType::kFloat32, ReduceOp::kBxor), CommError);
    EXPECT_THROW(c.broadcast(&v, 4, 2), CommError);
    EXPECT_THROW(c.send(&v, 4, c.rank(), 0), CommError);
    c.all_reduce(&v, &v, 1, DType::kFloat32, ReduceOp::kSum);
    EXPECT_EQ(v, 2.0f);
  }));
}

TEST_F(CollectivesFailures, TimeoutNamesTheLatePeerAndFailsItFast) {
  std::promise<void> rank0_failed;
  auto failed = rank0_failed.get_future().share();
  std::string late_error;
  Clock::duration waited{}, late_waited{};
  const auto errors = run_ranks(2, test_options(10s), [&](ShmComm& c) {
    float v = 1;
    if (c.rank() == 0) {
      c.set_timeout(300ms);
      const auto t0 = Clock::now();
      try {
        c.all_reduce(&v, &v, 1, DType::kFloat32, ReduceOp::kSum);
      } catch (const CommError&) {
        waited = Clock::now() - t0;
        rank0_failed.set_value();
        throw;
      }
      rank0_failed.set_value();
    } else {
      failed.wait();
      const auto t0 = Clock::now();
      try {
        c.barrier();
      } catch (const CommError& e) {
        late_waited = Clock::now() - t0;
        late_error = e.what();
      }
    }
  });
  const std::string want =
      "neuron collectives: all_reduce on group 'test' (rank 0 of 2) timed "
      "out after 300 ms waiting for rank 1 (pid " +
      std::to_string(getpid()) +
      "): the peer is alive but did not make the "
      "same call; check that every rank calls the same collectives";
  EXPECT_EQ(errors[0].rfind(want, 0), 0u) << errors[0];
  EXPECT_GE(waited, 300ms);
  EXPECT_LT(waited, 1300ms);
  EXPECT_NE(late_error.find("failed because rank 0 failed first"), std::string::npos) << late_error;
  EXPECT_LT(late_waited, 200ms);
}

TEST_F(CollectivesFailures, PeerThatDestroyedItsCommunicatorFailsTheWaitAtOnce) {
  const auto errors = run_ranks(2, test_options(10s), [&](ShmComm& c) {
    if (c.rank() == 1) return;
    const auto t0 = Clock::now();
    std::vector<float> v(5000);
    try {
      c.all_reduce(v.data(), v.data(), v.size(), DType::kFloat32, ReduceOp::kMax);
    } catch (const CommError&) {
      EXPECT_LT(Clock::now() - t0, 2s);
      throw;
    }
  });
  EXPECT_NE(errors[0].find("rank 1 (pid " + std::to_string(getpid()) +
                           ") destroyed its communicator without making this call"),
            std::string::npos)
      << errors[0];
}

TEST_F(CollectivesFailures, JoinTimesOutNamingTheMissingRanks) {
  const auto t0 = Clock::now();
  try {
    ShmComm::join(unique_name(), 0, 3, test_options(200ms));
    ADD_FAILURE() << "join returned without the other ranks";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("ranks 1, 2 never joined"), std::string::npos) << e.what();
  }
  EXPECT_LT(Clock::now() - t0, 1s);
}

// Forks a child process that joins `name` as `rank` of `world` and runs fn, then _exit(0)s
// (1 on a CommError). Call before starting threads.
pid_t fork_rank(const std::string& name, int rank, int world, const Options& opts,
                const std::function<void(ShmComm&)>& fn) {
  const pid_t pid = fork();
  if (pid != 0) return pid;
  int status = 0;
  try {
    auto comm = ShmComm::join(name, rank, world, opts);
    fn(*comm);
    _exit(0);
  } catch (...) {
    status = 1;
  }
  _exit(status);
}

TEST_F(CollectivesFailures, PeerProcessThatExitsFailsTheWaitWithinASlice) {
  const std::string name = unique_name();
  const Options opts = test_options(10s);
  const pid_t child = fork_rank(name, 1, 2, opts, [](ShmComm& c) { c.barrier(); });
  ASSERT_GT(child, 0);
  std::string error;
  Clock::duration waited{};
  try {
    auto comm = ShmComm::join(name, 0, 2, opts);
    comm->barrier();
    const auto t0 = Clock::now();
    try {
      float v = 1;
      comm->all_reduce(&v, &v, 1, DType::kFloat32, ReduceOp::kSum);
    } catch (const CommError& e) {
      waited = Clock::now() - t0;
      error = e.what();
    }
  } catch (const CommError& e) {
    ADD_FAILURE() << e.what();
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_NE(error.find("rank 1 (pid " + std::to_string(child) + ") exited or was killed"),
            std::string::npos)
      << error;
  EXPECT_LT(waited, 2s);
}

TEST_F(CollectivesFailures, PeerProcessKilledMidCollectiveFailsEveryOtherRank) {
  const std::string name = unique_name();
  const Options opts = test_options(10s);
  constexpr size_t kCount = 20000;  // many chunks: the child blocks inside the all_reduce
  const pid_t child = fork_rank(name, 2, 3, opts, [](ShmComm& c) {
    c.barrier();
    std::vector<float> v(kCount, 1.0f);
    c.all_reduce(v.data(), v.data(), kCount, DType::kFloat32, ReduceOp::kSum);
    _exit(3);  // not reached: the parent kills this process first
  });
  ASSERT_GT(child, 0);
  std::vector<Clock::duration> waited(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      try {
        auto comm = ShmComm::join(name, r, 3, opts);
        comm->barrier();
        if (r == 0) {
          std::this_thread::sleep_for(100ms);
          kill(child, SIGKILL);
        }
        std::vector<float> v(kCount, 1.0f);
        const auto t0 = Clock::now();
        try {
          comm->all_reduce(v.data(), v.data(), kCount, DType::kFloat32, ReduceOp::kSum);
        } catch (const CommError& e) {
          waited[r] = Clock::now() - t0;
          errors[r] = e.what();
        }
      } catch (const CommError& e) {
        ADD_FAILURE() << e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  const std::string died = "rank 2 (pid " + std::to_string(child) + ") exited or was killed";
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find(died), std::string::npos) << errors[r];
    EXPECT_LT(waited[r], 2s) << "rank " << r;
  }
}

TEST_F(CollectivesFailures, NoSegmentOutlivesTheTests) {
  EXPECT_EQ(leftover_segments(), std::vector<std::string>{});
}

}  // namespace
}  // namespace openneuron::collectives
