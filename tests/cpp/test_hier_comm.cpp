// gtests for the hierarchical collectives of a group spanning hosts (csrc/collectives/hier_comm.h):
// threads as ranks, "hosts" as separate shared-memory groups, the leaders' and the flat
// transports shared-memory groups too (the glue uses Gloo for them). Every hierarchical call
// against a serial reference, for 2 hosts x 2 ranks, 3 x 2 and 2 x 3; the calls the flat group
// carries; and a failure on one host reaching every rank.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "collectives/hier_comm.h"

namespace openneuron::collectives {
namespace {

using namespace std::chrono_literals;

std::string unique_name(const std::string& what) {
  static std::atomic<int> counter{0};
  return "/openneuron-test-hier-" + std::to_string(getpid()) + "-" + what + "-" +
         std::to_string(counter++);
}

Options small_options() {
  Options o;
  o.group_name = "hier";
  o.timeout = 10s;
  o.slot_bytes = 4 << 10;  // chunked transfers below
  o.channel_bytes = 4 << 10;
  return o;
}

// Runs fn(comm) on hosts * per_host threads; returns each rank's CommError message.
std::vector<std::string> run_hier(int hosts, int per_host,
                                  const std::function<void(ShmComm&)>& fn) {
  const int size = hosts * per_host;
  std::vector<std::string> local_names, errors(size);
  for (int h = 0; h < hosts; ++h) local_names.push_back(unique_name("host" + std::to_string(h)));
  const std::string leaders_name = unique_name("leaders"), flat_name = unique_name("flat");
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        const Options o = small_options();
        const int host = r / per_host, local_rank = r % per_host;
        auto local = ShmComm::join(local_names[host], local_rank, per_host, o);
        std::unique_ptr<ShmComm> leaders;
        if (local_rank == 0) leaders = ShmComm::join(leaders_name, host, hosts, o);
        auto flat = ShmComm::join(flat_name, r, size, o);
        auto comm =
            make_hier_comm(r, size, o, std::move(local), std::move(leaders), std::move(flat));
        fn(*comm);
      } catch (const CommError& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

int32_t value(int rank, size_t i) { return static_cast<int32_t>((rank + 1) * 1000 + i % 97); }

void check_all(int hosts, int per_host) {
  const int size = hosts * per_host;
  const size_t n = 3000;  // > a slot half: chunked
  auto errors = run_hier(hosts, per_host, [&](ShmComm& c) {
    const int r = c.rank();
    // all_reduce (int32 sum is exact in any order; float32 of small integers too)
    std::vector<int32_t> x(n);
    for (size_t i = 0; i < n; ++i) x[i] = value(r, i);
    c.all_reduce(x.data(), x.data(), n, DType::kInt32, ReduceOp::kSum);
    for (size_t i = 0; i < n; ++i) {
      int32_t want = 0;
      for (int p = 0; p < size; ++p) want += value(p, i);
      ASSERT_EQ(x[i], want) << "all_reduce rank " << r << " i " << i;
    }
    std::vector<float> f(n, static_cast<float>(r + 1)), fo(n);
    c.all_reduce(f.data(), fo.data(), n, DType::kFloat32, ReduceOp::kMax);
    for (float v : fo) ASSERT_EQ(v, static_cast<float>(size));
    // broadcast from every root (on and off the leader)
    for (int root = 0; root < size; ++root) {
      std::vector<int32_t> b(n, r == root ? root + 7 : -1);
      c.broadcast(b.data(), n * 4, root);
      for (int32_t v : b) ASSERT_EQ(v, root + 7) << "broadcast root " << root;
    }
    // all_gather, out of place and in place
    std::vector<int32_t> in(n), out(n * size);
    for (size_t i = 0; i < n; ++i) in[i] = value(r, i);
    c.all_gather(in.data(), out.data(), n * 4);
    std::vector<int32_t> inplace(n * size, -1);
    std::copy(in.begin(), in.end(), inplace.begin() + r * n);
    c.all_gather(inplace.data() + r * n, inplace.data(), n * 4);
    for (int p = 0; p < size; ++p) {
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(out[p * n + i], value(p, i)) << "all_gather block " << p;
        ASSERT_EQ(inplace[p * n + i], value(p, i)) << "in-place all_gather block " << p;
      }
    }
    // reduce_scatter: block q of rank p holds value(p, q * n + i)
    std::vector<int32_t> rs_in(n * size), rs_out(n);
    for (int q = 0; q < size; ++q)
      for (size_t i = 0; i < n; ++i) rs_in[q * n + i] = value(r, q * n + i);
    c.reduce_scatter(rs_in.data(), rs_out.data(), n, DType::kInt32, ReduceOp::kSum);
    for (size_t i = 0; i < n; ++i) {
      int32_t want = 0;
      for (int p = 0; p < size; ++p) want += value(p, r * n + i);
      ASSERT_EQ(rs_out[i], want) << "reduce_scatter rank " << r;
    }
    // the flat group's calls
    std::vector<int32_t> red(n);
    c.reduce(in.data(), red.data(), n, DType::kInt32, ReduceOp::kSum, size - 1);
    if (r == size - 1) {
      for (size_t i = 0; i < n; ++i) {
        int32_t want = 0;
        for (int p = 0; p < size; ++p) want += value(p, i);
        ASSERT_EQ(red[i], want);
      }
    }
    std::vector<int32_t> g(r == 1 ? n * size : 0);
    c.gather(in.data(), g.data(), n * 4, 1);
    if (r == 1) {
      ASSERT_EQ(g, out);
    }
    c.barrier();
    if (size > 1) {
      int32_t token = r;
      if (r == 0) c.send(&token, 4, size - 1, 3);
      if (r == size - 1) {
        c.recv(&token, 4, 0, 3);
        ASSERT_EQ(token, 0);
      }
    }
  });
  for (int r = 0; r < size; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(HierComm, TwoHostsOfTwo) { check_all(2, 2); }
TEST(HierComm, ThreeHostsOfTwo) { check_all(3, 2); }
TEST(HierComm, TwoHostsOfThree) { check_all(2, 3); }

TEST(HierComm, AMismatchOnOneHostFailsEveryRank) {
  auto errors = run_hier(2, 2, [](ShmComm& c) {
    std::vector<float> x(16, 1.0f);
    // rank 1 (host 0) reduces a different count: its host fails at once, and the other host's
    // ranks fail as the flat group's barrier sees the failed ranks leave.
    c.all_reduce(x.data(), x.data(), c.rank() == 1 ? 8 : 16, DType::kFloat32, ReduceOp::kSum);
    c.barrier();
  });
  for (int r = 0; r < 4; ++r) EXPECT_NE(errors[r], "") << "rank " << r;
  EXPECT_NE(errors[0].find("mismatched collectives"), std::string::npos) << errors[0];
}

TEST(HierComm, InconsistentLayoutIsRejected) {
  EXPECT_THROW(make_hier_comm(0, 4, small_options(), nullptr, nullptr, nullptr), CommError);
}

}  // namespace
}  // namespace openneuron::collectives
