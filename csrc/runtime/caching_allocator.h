// The per-device caching allocator: size-class pools for small blocks, split segments for
// large ones, stream-aware reuse (a freed block is reused only on its own stream, or after
// every stream recorded with allocator_record_stream has reached the free), exact statistics
// in the shape of c10's DeviceStats, and an out-of-memory error a user can act on.
// Sits on Hal::mem_alloc/mem_free. All functions are thread-safe and never take the GIL.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "stream.h"

namespace openneuron::runtime {

struct Stat {
  int64_t current = 0;
  int64_t peak = 0;
  int64_t allocated = 0;  // accumulated increments
  int64_t freed = 0;      // accumulated decrements
};
enum StatIndex { kStatAggregate = 0, kStatSmallPool = 1, kStatLargePool = 2 };
using StatArray = std::array<Stat, 3>;

struct DeviceStats {
  StatArray allocation;      // blocks handed out
  StatArray segment;         // segments from Hal::mem_alloc
  StatArray active;          // blocks allocated or awaiting stream uses
  StatArray inactive_split;  // free blocks inside partially used segments
  StatArray allocated_bytes;
  StatArray reserved_bytes;
  StatArray active_bytes;
  StatArray inactive_split_bytes;
  StatArray requested_bytes;      // bytes asked for, before rounding
  int64_t num_alloc_retries = 0;  // allocations that had to release the cache and retry
  int64_t num_ooms = 0;
  int64_t num_sync_all_streams = 0;
  int64_t num_device_alloc = 0;  // Hal::mem_alloc calls
  int64_t num_device_free = 0;   // Hal::mem_free calls
  Stat oversize_allocations;
  Stat oversize_segments;
  int64_t max_split_size = -1;
};

struct BlockInfo {
  uint64_t address = 0;
  uint64_t size = 0;
  uint64_t requested_size = 0;
  bool allocated = false;
  bool active = false;   // allocated, or freed but awaiting recorded streams
  uint64_t context = 0;  // the caller's opaque context id (allocator_alloc), 0 when not allocated
};
struct SegmentInfo {
  DeviceIndex device = 0;
  uint64_t address = 0;
  uint64_t total_size = 0;
  uint64_t allocated_size = 0;
  int64_t stream = 0;  // Stream::id of the segment's stream
  bool is_large = false;
  std::vector<BlockInfo> blocks;
};

// At least `bytes` of device memory for use on `stream` (its device is the block's device).
// bytes == 0 returns nullptr. Throws OutOfMemoryError ("neuron:0 out of memory: tried to
// allocate 512.0 MiB (in use 7.6 GiB of 8.0 GiB capacity, 1.1 GiB cached). Free tensors, call
// torch.neuron.empty_cache(), or raise OPENNEURON_DEVICE_MEMORY.") after releasing the cache
// and retrying once; the allocator stays usable after it.
// context (optional) is an opaque id the caller attaches to the block (e.g. the allocation's
// stack, kept by the caller): reported in BlockInfo while the block is allocated and handed back
// by allocator_free. The allocator never interprets it.
void* allocator_alloc(size_t bytes, const Stream& stream, uint64_t context = 0);
// ptr from allocator_alloc (nullptr is ignored). Any thread. Returns the block's context id
// (0 for nullptr or none), so the caller can release what the id stands for.
uint64_t allocator_free(void* ptr);
// Marks that work on s uses the block containing ptr: it is not reused until s reaches the
// point where the block is freed.
void allocator_record_stream(void* ptr, const Stream& s);
// Returns unused cached segments of device d to the HAL (every device if d < 0).
void allocator_empty_cache(DeviceIndex d);
DeviceStats allocator_stats(DeviceIndex d);
// Limits device d's reserved memory (cached included) to fraction * its capacity, as
// torch.cuda.set_per_process_memory_fraction: an allocation past it releases the cache, retries
// and then raises OutOfMemoryError naming the limit. fraction in [0, 1] (else DeviceError);
// memory already reserved beyond a lowered limit stays until freed and emptied.
void allocator_set_memory_fraction(double fraction, DeviceIndex d);
double allocator_memory_fraction(DeviceIndex d);  // 1.0 until set
void allocator_reset_peak(DeviceIndex d);
void allocator_reset_accumulated(DeviceIndex d);
std::vector<SegmentInfo> allocator_snapshot(DeviceIndex d);
// Graph memory pools (graph.h). While a stream captures into pool p, allocations on it take
// blocks of p only, and blocks of p freed go back to p, never to another stream; p's free
// blocks are never released (empty_cache) while a graph holds p. When the last hold is
// released, p's blocks become ordinary blocks of the stream that first held it.
void allocator_pool_hold(const Stream& s, uint64_t pool);
void allocator_pool_release(DeviceIndex d, uint64_t pool);

// Device whose allocator owns the block containing ptr; -1 if none.
DeviceIndex allocator_device_of(const void* ptr);

}  // namespace openneuron::runtime
