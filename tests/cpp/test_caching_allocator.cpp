// gtests for the caching allocator over the process HAL (test_environment.cpp: 2 devices of
// 1 GiB): rounding, same-stream reuse, stream-aware deferral (record_stream), split and
// coalesce, exact statistics, out-of-memory message and recovery, empty_cache, device_of, and
// the caller's opaque per-block context id, the per-process memory fraction.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "runtime/caching_allocator.h"
#include "runtime/errors.h"
#include "test_util.h"

namespace openneuron::runtime {
namespace {

using testing::Gate;

constexpr size_t kMiB = size_t{1} << 20;

int64_t allocated(DeviceIndex d) {
  return allocator_stats(d).allocated_bytes[kStatAggregate].current;
}
int64_t reserved(DeviceIndex d) {
  return allocator_stats(d).reserved_bytes[kStatAggregate].current;
}

const SegmentInfo* segment_of(const std::vector<SegmentInfo>& segs, const void* p) {
  const auto a = reinterpret_cast<uint64_t>(p);
  for (const SegmentInfo& s : segs) {
    if (a >= s.address && a < s.address + s.total_size) return &s;
  }
  return nullptr;
}

TEST(CachingAllocator, RoundingAndSegmentSizes) {
  const Stream s = stream_from_pool(0);
  const DeviceStats before = allocator_stats(0);
  void* a = allocator_alloc(1, s);
  EXPECT_EQ(allocated(0) - before.allocated_bytes[0].current, 512);
  void* b = allocator_alloc(513, s);
  EXPECT_EQ(allocated(0) - before.allocated_bytes[0].current, 512 + 1024);
  void* c = allocator_alloc(kMiB + 1, s);  // large: 2 MiB
  EXPECT_EQ(allocator_stats(0).allocated_bytes[kStatLargePool].current -
                before.allocated_bytes[kStatLargePool].current,
            static_cast<int64_t>(2 * kMiB));
  void* d = allocator_alloc(12 * kMiB, stream_from_pool(0, kStreamPriorityHigh));  // own segment
  const auto segs = allocator_snapshot(0);
  EXPECT_EQ(segment_of(segs, a)->total_size, 2 * kMiB);
  EXPECT_FALSE(segment_of(segs, a)->is_large);
  EXPECT_EQ(segment_of(segs, c)->total_size, 20 * kMiB);
  EXPECT_TRUE(segment_of(segs, c)->is_large);
  EXPECT_EQ(segment_of(segs, d)->total_size, 12 * kMiB);
  EXPECT_EQ(segment_of(segs, a)->stream, s.id());
  EXPECT_EQ(allocator_alloc(0, s), nullptr);
  for (void* p : {a, b, c, d}) allocator_free(p);
  EXPECT_EQ(allocated(0), before.allocated_bytes[0].current);
}

TEST(CachingAllocator, ReuseOnSameStreamOnly) {
  const Stream s1 = stream_from_pool(0);
  const Stream s2 = stream_from_pool(0);
  void* p = allocator_alloc(1000, s1);
  allocator_free(p);
  void* q = allocator_alloc(1000, s1);
  EXPECT_EQ(q, p);
  allocator_free(q);
  void* r = allocator_alloc(1000, s2);
  EXPECT_NE(r, p);
  const auto segs = allocator_snapshot(0);
  EXPECT_NE(segment_of(segs, r), segment_of(segs, p));
  allocator_free(r);
}

TEST(CachingAllocator, RecordStreamDefersReuseUntilStreamReachesFree) {
  const Stream s = stream_from_pool(0);
  const Stream user = stream_from_pool(0);
  const int64_t base_active = allocator_stats(0).active_bytes[0].current;
  void* p = allocator_alloc(4096, s);
  Gate gate;
  user.enqueue(gate.work());
  allocator_record_stream(p, user);
  allocator_record_stream(p, s);  // own stream: ignored
  allocator_free(p);
  EXPECT_EQ(allocator_stats(0).active_bytes[0].current - base_active, 4096);
  void* q = allocator_alloc(4096, s);
  EXPECT_NE(q, p);  // still in use by `user`
  allocator_free(q);
  gate.open();
  user.synchronize();
  void* r = allocator_alloc(4096, s);
  EXPECT_EQ(r, p);
  allocator_free(r);
  EXPECT_EQ(allocator_stats(0).active_bytes[0].current, base_active);
}

TEST(CachingAllocator, SplitAndCoalesce) {
  const Stream s = stream_default(0);  // no other test allocates on it: a fresh segment
  allocator_empty_cache(0);
  const DeviceStats before = allocator_stats(0);
  void* a = allocator_alloc(1000, s);
  void* b = allocator_alloc(1000, s);
  void* c = allocator_alloc(1000, s);
  ASSERT_EQ(static_cast<char*>(b), static_cast<char*>(a) + 1024);
  ASSERT_EQ(static_cast<char*>(c), static_cast<char*>(b) + 1024);
  EXPECT_EQ(segment_of(allocator_snapshot(0), a)->blocks.size(), 4u);  // a, b, c, rest
  allocator_free(b);
  EXPECT_EQ(allocator_stats(0).inactive_split[0].current - before.inactive_split[0].current, 2);
  allocator_free(a);
  allocator_free(c);
  const auto segs = allocator_snapshot(0);
  const SegmentInfo* seg = segment_of(segs, a);
  ASSERT_NE(seg, nullptr);
  ASSERT_EQ(seg->blocks.size(), 1u);
  EXPECT_EQ(seg->blocks[0].size, 2 * kMiB);
  EXPECT_FALSE(seg->blocks[0].allocated);
  EXPECT_EQ(seg->allocated_size, 0u);
  const DeviceStats after = allocator_stats(0);
  EXPECT_EQ(after.inactive_split[0].current, before.inactive_split[0].current);
  EXPECT_EQ(after.inactive_split_bytes[0].current, before.inactive_split_bytes[0].current);
}

TEST(CachingAllocator, StatsAreExact) {
  const Stream s = stream_from_pool(1);
  allocator_empty_cache(1);
  allocator_reset_accumulated(1);
  allocator_reset_peak(1);
  const DeviceStats base = allocator_stats(1);
  std::vector<void*> ptrs;
  for (int i = 0; i < 10; ++i) ptrs.push_back(allocator_alloc(100, s));
  ptrs.push_back(allocator_alloc(3 * kMiB, s));
  DeviceStats st = allocator_stats(1);
  EXPECT_EQ(st.allocation[0].current - base.allocation[0].current, 11);
  EXPECT_EQ(st.allocated_bytes[kStatSmallPool].current - base.allocated_bytes[1].current, 5120);
  EXPECT_EQ(st.allocated_bytes[kStatLargePool].current - base.allocated_bytes[2].current,
            static_cast<int64_t>(4 * kMiB));
  EXPECT_EQ(st.requested_bytes[0].current - base.requested_bytes[0].current,
            static_cast<int64_t>(1000 + 3 * kMiB));
  EXPECT_EQ(st.reserved_bytes[0].current - base.reserved_bytes[0].current,
            static_cast<int64_t>(22 * kMiB));
  EXPECT_EQ(st.segment[0].current - base.segment[0].current, 2);
  EXPECT_EQ(st.num_device_alloc, 2);
  for (void* p : ptrs) allocator_free(p);
  st = allocator_stats(1);
  EXPECT_EQ(st.allocated_bytes[0].current, base.allocated_bytes[0].current);
  EXPECT_EQ(st.active_bytes[0].current, base.active_bytes[0].current);
  EXPECT_EQ(st.requested_bytes[0].current, base.requested_bytes[0].current);
  EXPECT_EQ(st.allocated_bytes[0].peak, base.allocated_bytes[0].current + 5120 + 4 * 1048576);
  EXPECT_EQ(st.allocation[0].allocated, 11);
  EXPECT_EQ(st.allocation[0].freed, 11);
  allocator_reset_peak(1);
  EXPECT_EQ(allocator_stats(1).allocated_bytes[0].peak, st.allocated_bytes[0].current);
  allocator_reset_accumulated(1);
  EXPECT_EQ(allocator_stats(1).allocation[0].allocated, 0);
  EXPECT_EQ(allocator_stats(1).num_device_alloc, 0);
  allocator_empty_cache(1);
  EXPECT_EQ(reserved(1), base.reserved_bytes[0].current);
  EXPECT_EQ(allocator_stats(1).num_device_free, 2);
}

TEST(CachingAllocator, OutOfMemoryMessageAndRecovery) {
  const Stream s = stream_from_pool(1);
  allocator_empty_cache(1);
  ASSERT_EQ(reserved(1), 0);
  void* held = allocator_alloc(100 * kMiB, s);
  void* cached = allocator_alloc(300 * kMiB, s);
  allocator_free(cached);
  const int64_t ooms = allocator_stats(1).num_ooms;
  try {
    allocator_alloc(2 * 1024 * kMiB, s);
    ADD_FAILURE() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    EXPECT_STREQ(e.what(),
                 "neuron:1 out of memory: tried to allocate 2.0 GiB (in use 100.0 MiB of 1.0 GiB "
                 "capacity, 0 B cached). Free tensors, call torch.neuron.empty_cache(), or raise "
                 "OPENNEURON_DEVICE_MEMORY.");
  }
  EXPECT_EQ(allocator_stats(1).num_ooms, ooms + 1);
  EXPECT_THROW(allocator_alloc(~size_t{0} - 100, s), OutOfMemoryError);  // no rounding overflow
  EXPECT_EQ(allocator_stats(1).num_ooms, ooms + 2);
  EXPECT_EQ(reserved(1), static_cast<int64_t>(100 * kMiB));  // the cache was released
  void* after = allocator_alloc(800 * kMiB, s);              // still usable
  EXPECT_NE(after, nullptr);
  allocator_free(after);
  allocator_free(held);
  allocator_empty_cache(1);
  EXPECT_EQ(reserved(1), 0);
}

TEST(CachingAllocator, MemoryFractionLimitsReservedMemory) {
  const Stream s = stream_from_pool(1);
  allocator_empty_cache(1);
  EXPECT_EQ(allocator_memory_fraction(1), 1.0);
  allocator_set_memory_fraction(0.25, 1);  // 256 MiB of 1 GiB
  EXPECT_EQ(allocator_memory_fraction(1), 0.25);
  allocator_free(allocator_alloc(100 * kMiB, s));  // cached
  void* p = allocator_alloc(200 * kMiB, s);        // fits only once the cache is released
  EXPECT_LE(reserved(1), static_cast<int64_t>(256 * kMiB));
  try {
    allocator_alloc(100 * kMiB, s);
    ADD_FAILURE() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("this process is limited to 256.0 MiB by "
                                         "torch.neuron.set_per_process_memory_fraction"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(allocator_set_memory_fraction(1.5, 1), DeviceError);
  EXPECT_THROW(allocator_set_memory_fraction(-0.1, 1), DeviceError);
  allocator_set_memory_fraction(1.0, 1);
  void* q = allocator_alloc(100 * kMiB, s);  // the limit is gone
  allocator_free(q);
  allocator_free(p);
  allocator_empty_cache(1);
  EXPECT_EQ(reserved(1), 0);
}

TEST(CachingAllocator, AllocationReleasesCacheWhenFull) {
  const Stream a = stream_from_pool(1);
  const Stream b = stream_from_pool(1);
  allocator_empty_cache(1);
  const int64_t retries = allocator_stats(1).num_alloc_retries;
  allocator_free(allocator_alloc(700 * kMiB, a));  // cached on stream a
  void* p = allocator_alloc(700 * kMiB, b);        // needs a's cached segment released
  EXPECT_EQ(allocator_stats(1).num_alloc_retries, retries + 1);
  allocator_free(p);
  allocator_empty_cache(1);
}

TEST(CachingAllocator, OutOfMemoryWaitsForRecordedStreams) {
  const Stream s = stream_from_pool(1);
  const Stream user = stream_from_pool(1);
  allocator_empty_cache(1);
  void* p = allocator_alloc(700 * kMiB, s);
  Gate gate;
  user.enqueue(gate.work());
  allocator_record_stream(p, user);
  allocator_free(p);
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    gate.open();
  });
  void* q = allocator_alloc(700 * kMiB, s);
  EXPECT_EQ(q, p);
  opener.join();
  allocator_free(q);
  allocator_empty_cache(1);
}

TEST(CachingAllocator, EmptyCacheReturnsSegments) {
  const Stream s = stream_from_pool(0);
  const int64_t base = reserved(0);
  void* p = allocator_alloc(64 * kMiB, s);
  allocator_free(p);
  EXPECT_EQ(reserved(0) - base, static_cast<int64_t>(64 * kMiB));
  uint64_t free_before = 0, free_after = 0, total = 0;
  hal().memory_info(0, &free_before, &total);
  allocator_empty_cache(-1);
  hal().memory_info(0, &free_after, &total);
  EXPECT_LE(reserved(0), base);
  EXPECT_GE(free_after - free_before, 64 * kMiB);
}

TEST(CachingAllocator, DeviceOf) {
  void* p = allocator_alloc(10000, stream_from_pool(1));
  EXPECT_EQ(allocator_device_of(p), 1);
  EXPECT_EQ(allocator_device_of(static_cast<char*>(p) + 9999), 1);
  int local = 0;
  EXPECT_EQ(allocator_device_of(&local), -1);
  EXPECT_EQ(allocator_device_of(nullptr), -1);
  allocator_free(p);
  EXPECT_EQ(allocator_device_of(p), -1);
  EXPECT_THROW(allocator_free(p), DeviceError);
}

TEST(CachingAllocator, ConcurrentAllocFreeKeepsStatsConsistent) {
  const int64_t base = allocated(0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t] {
      const Stream s = stream_from_pool(0);
      std::vector<void*> ptrs;
      for (int i = 0; i < 2000; ++i) {
        ptrs.push_back(allocator_alloc(static_cast<size_t>(64 + (i * 37 + t) % 200000), s));
        if (i % 3 == 2) {
          allocator_free(ptrs[ptrs.size() - 2]);
          ptrs.erase(ptrs.end() - 2);
        }
      }
      for (void* p : ptrs) allocator_free(p);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(allocated(0), base);
}

// A block freed while queued work on its stream still uses it (stream-ordered free, as in
// CUDA) goes back to the HAL only after that work has run.
TEST(CachingAllocator, EmptyCacheWaitsForQueuedWork) {
  const Stream s = stream_from_pool(1);
  auto* p = static_cast<char*>(allocator_alloc(12 * kMiB, s));  // its own segment
  Gate gate;
  s.enqueue(gate.work());
  std::atomic<bool> wrote{false};
  s.enqueue(testing::make_work([p, &wrote] {
    p[12 * kMiB - 1] = 1;  // a use-after-free here is what ASan would report
    wrote = true;
  }));
  allocator_free(p);
  std::atomic<bool> emptied{false};
  std::thread t([&] {
    allocator_empty_cache(1);
    emptied = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(emptied.load());
  gate.open();
  t.join();
  EXPECT_TRUE(wrote.load());
  EXPECT_EQ(allocator_device_of(p), -1);
}

const BlockInfo* block_at(const std::vector<SegmentInfo>& segs, const void* p) {
  const auto a = reinterpret_cast<uint64_t>(p);
  for (const SegmentInfo& s : segs) {
    for (const BlockInfo& b : s.blocks) {
      if (b.address == a) return &b;
    }
  }
  return nullptr;
}

// The caller's opaque context id rides with an allocated block: reported by the snapshot,
// handed back by allocator_free, and gone once the block is free (a reused block carries the
// new allocation's id, never the old one).
TEST(CachingAllocator, ContextIdFollowsTheAllocation) {
  const Stream s = stream_from_pool(0);
  void* p = allocator_alloc(4096, s, 0xC0FFEE00000042ull);
  void* q = allocator_alloc(4096, s);  // no context
  auto segs = allocator_snapshot(0);
  ASSERT_NE(block_at(segs, p), nullptr);
  EXPECT_EQ(block_at(segs, p)->context, 0xC0FFEE00000042ull);
  EXPECT_EQ(block_at(segs, q)->context, 0u);
  EXPECT_EQ(allocator_free(p), 0xC0FFEE00000042ull);
  EXPECT_EQ(allocator_free(q), 0u);
  EXPECT_EQ(allocator_free(nullptr), 0u);
  for (const SegmentInfo& seg : allocator_snapshot(0)) {
    for (const BlockInfo& b : seg.blocks) {
      if (!b.allocated) {
        EXPECT_EQ(b.context, 0u);
      }
    }
  }
  void* r = allocator_alloc(4096, s, 7);  // a reused block carries only the new id
  EXPECT_EQ(block_at(allocator_snapshot(0), r)->context, 7u);
  EXPECT_EQ(allocator_free(r), 7u);
}

// A block freed with a use recorded on another stream returns its id at free time, while the
// block itself waits for that stream.
TEST(CachingAllocator, ContextIdReturnedForDeferredFree) {
  const Stream s = stream_from_pool(1);
  const Stream other = stream_from_pool(1, kStreamPriorityHigh);
  void* p = allocator_alloc(kMiB, s, 99);
  Gate gate;
  other.enqueue(gate.work());
  allocator_record_stream(p, other);
  EXPECT_EQ(allocator_free(p), 99u);
  const std::vector<SegmentInfo> segs = allocator_snapshot(1);
  const BlockInfo* b = block_at(segs, p);
  ASSERT_NE(b, nullptr);
  EXPECT_TRUE(b->active);
  EXPECT_FALSE(b->allocated);
  EXPECT_EQ(b->context, 0u);
  gate.open();
  other.synchronize();
}

// Many threads allocating with distinct ids each get their own id back (no cross-talk under
// the per-device mutex and the sharded pointer map).
TEST(CachingAllocator, ContextIdConcurrent) {
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([t, &mismatches] {
      const Stream s = stream_from_pool(0);
      for (uint64_t i = 1; i <= 200; ++i) {
        const uint64_t id = (static_cast<uint64_t>(t) << 32) | i;
        void* p = allocator_alloc(512 * (1 + i % 7), s, id);
        if (allocator_free(p) != id) ++mismatches;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

}  // namespace
}  // namespace openneuron::runtime
