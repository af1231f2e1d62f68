// gtests for the pinned host allocator: page alignment, is_pinned for interior addresses,
// size-class reuse, deferred reuse after host_record_stream, stats and empty_cache.
#include <gtest/gtest.h>

#include "runtime/host_allocator.h"
#include "test_util.h"

namespace openneuron::runtime {
namespace {

using testing::Gate;

TEST(HostAllocator, AlignmentPinnedAndReuse) {
  const HostStats base = host_stats();
  void* p = host_alloc(100);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 4096, 0u);
  EXPECT_TRUE(host_is_pinned(p));
  EXPECT_TRUE(host_is_pinned(static_cast<char*>(p) + 4095));
  int local = 0;
  EXPECT_FALSE(host_is_pinned(&local));
  EXPECT_EQ(host_alloc(0), nullptr);
  HostStats st = host_stats();
  EXPECT_EQ(st.allocated_bytes - base.allocated_bytes, 4096);
  EXPECT_EQ(st.num_allocs - base.num_allocs, 1);
  host_free(p);
  EXPECT_FALSE(host_is_pinned(p));
  st = host_stats();
  EXPECT_EQ(st.allocated_bytes, base.allocated_bytes);
  EXPECT_EQ(st.num_frees - base.num_frees, 1);
  void* q = host_alloc(3000);  // same size class
  EXPECT_EQ(q, p);
  host_free(q);
}

TEST(HostAllocator, RecordStreamDefersReuse) {
  const Stream s = stream_from_pool(0);
  void* p = host_alloc(100000);
  Gate gate;
  s.enqueue(gate.work());
  host_record_stream(static_cast<char*>(p) + 10, s);
  host_free(p);
  void* q = host_alloc(100000);
  EXPECT_NE(q, p);
  host_free(q);
  gate.open();
  s.synchronize();
  void* r1 = host_alloc(100000);
  void* r2 = host_alloc(100000);
  EXPECT_TRUE(r1 == p || r2 == p);
  host_free(r1);
  host_free(r2);
}

TEST(HostAllocator, EmptyCacheReleasesFreeBlocks) {
  host_empty_cache();
  const HostStats base = host_stats();
  void* p = host_alloc(size_t{1} << 20);
  host_free(p);
  EXPECT_EQ(host_stats().reserved_bytes - base.reserved_bytes, 1 << 20);
  host_empty_cache();
  EXPECT_EQ(host_stats().reserved_bytes, base.reserved_bytes);
}

}  // namespace
}  // namespace openneuron::runtime
