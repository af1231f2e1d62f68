// The per-device caching allocator (in the manner of c10's CUDACachingAllocator, simplified):
// small requests (<= 1 MiB, rounded to 512 B) are carved from 2 MiB segments, large ones
// (rounded to 2 MiB) from 20 MiB segments below 10 MiB or their own segment above; free
// neighbours coalesce; a freed block is reused only on its own stream, or once every stream
// recorded for it has reached the free. One mutex per device; nothing here touches Python.
#include "caching_allocator.h"

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "config.h"
#include "device.h"
#include "errors.h"
#include "graph.h"
#include "stream_registry.h"

namespace openneuron::runtime {
namespace {

constexpr size_t kMinBlockSize = 512;
constexpr size_t kSmallSize = size_t{1} << 20;
constexpr size_t kSmallBuffer = size_t{2} << 20;
constexpr size_t kLargeBuffer = size_t{20} << 20;
constexpr size_t kMinLargeAlloc = size_t{10} << 20;
constexpr size_t kRoundLarge = size_t{2} << 20;
constexpr size_t kMaxRequest = size_t{1} << 56;  // beyond any capacity; keeps rounding exact

size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

size_t round_size(size_t bytes) {
  if (bytes <= kSmallSize) return round_up(std::max(bytes, kMinBlockSize), kMinBlockSize);
  return round_up(bytes, kRoundLarge);
}

size_t segment_size(size_t size) {
  if (size <= kSmallSize) return kSmallBuffer;
  if (size < kMinLargeAlloc) return kLargeBuffer;
  return size;
}

struct Block {
  DeviceIndex device = 0;
  int64_t stream = 0;  // Stream::id on `device`, or -pool for a graph pool's block
  size_t size = 0;
  size_t requested = 0;
  uint64_t context = 0;  // the caller's id while allocated (allocator_alloc)
  char* ptr = nullptr;
  bool small = false;
  bool allocated = false;
  int event_count = 0;  // records on other streams not yet reached
  Block* prev = nullptr;
  Block* next = nullptr;
  std::vector<Stream> stream_uses;
  bool is_split() const { return prev != nullptr || next != nullptr; }
};

// NOTE: pools are ordered by (stream, size, address): lower_bound on (stream, size) finds the
// best fit among the stream's own blocks, so a block never migrates to another stream.
struct BlockLess {
  bool operator()(const Block* a, const Block* b) const {
    if (a->stream != b->stream) return a->stream < b->stream;
    if (a->size != b->size) return a->size < b->size;
    return a->ptr < b->ptr;
  }
};
using BlockPool = std::set<Block*, BlockLess>;

void stat_update(Stat& s, int64_t delta) {
  s.current += delta;
  if (delta > 0) {
    s.allocated += delta;
    s.peak = std::max(s.peak, s.current);
  } else {
    s.freed -= delta;
  }
}

void stat_update(StatArray& a, bool small, int64_t delta) {
  if (delta == 0) return;
  stat_update(a[kStatAggregate], delta);
  stat_update(a[small ? kStatSmallPool : kStatLargePool], delta);
}

template <class F>
void for_each_stat(DeviceStats& s, F f) {
  for (StatArray* a :
       {&s.allocation, &s.segment, &s.active, &s.inactive_split, &s.allocated_bytes,
        &s.reserved_bytes, &s.active_bytes, &s.inactive_split_bytes, &s.requested_bytes}) {
    for (Stat& st : *a) f(st);
  }
  f(s.oversize_allocations);
  f(s.oversize_segments);
}

class DeviceCache {
 public:
  explicit DeviceCache(DeviceIndex d) : device_(d) {}

  Block* malloc(size_t bytes, int64_t stream, uint64_t context) {
    std::unique_lock<std::mutex> lk(mu_);
    if (bytes > kMaxRequest) {
      ++stats_.num_ooms;
      throw OutOfMemoryError(oom_message(bytes));
    }
    const size_t size = round_size(bytes);
    const bool small = size <= kSmallSize;
    BlockPool& pool = small ? small_ : large_;
    process_events();

    Block* b = take_free(pool, stream, size);
    if (b == nullptr) b = new_segment(size, stream, small);
    if (b == nullptr) {
      ++stats_.num_alloc_retries;
      release_cached(lk);
      b = new_segment(size, stream, small);
    }
    if (b == nullptr && !pending_.empty()) {
      wait_pending(lk);
      process_events();
      b = take_free(pool, stream, size);
      if (b == nullptr) {
        release_cached(lk);
        b = new_segment(size, stream, small);
      }
    }
    if (b == nullptr) {
      ++stats_.num_ooms;
      throw OutOfMemoryError(oom_message(bytes));
    }
    use_block(b, size, bytes);
    b->context = context;
    return b;
  }

  // Takes back an allocated block: to its pool at once, or once its recorded streams have
  // reached this point.
  // Returns the block's context id.
  uint64_t free(Block* b) {
    std::vector<Stream> uses;
    std::vector<HalEvent*> events;
    uint64_t context = 0;
    {
      std::lock_guard<std::mutex> lk(mu_);
      b->allocated = false;
      context = std::exchange(b->context, 0);
      stat_update(stats_.allocation, b->small, -1);
      stat_update(stats_.allocated_bytes, b->small, -static_cast<int64_t>(b->size));
      stat_update(stats_.requested_bytes, b->small, -static_cast<int64_t>(b->requested));
      if (b->stream_uses.empty()) {
        free_block(b);
        return context;
      }
      uses.swap(b->stream_uses);
      b->event_count = static_cast<int>(uses.size());
      for (size_t i = 0; i < uses.size(); ++i) events.push_back(take_event());
    }
    // NOTE: recorded unlocked: a HAL may block in event_record (a hardware queue; the software
    // core does not), and executors need this mutex when work releases tensors. The block is
    // neither allocated nor pooled meanwhile, so nobody can reuse or merge it.
    for (size_t i = 0; i < uses.size(); ++i) hal().event_record(events[i], uses[i].hal_stream());
    std::lock_guard<std::mutex> lk(mu_);
    for (size_t i = 0; i < uses.size(); ++i) {
      pending_[{uses[i].device(), uses[i].id()}].emplace_back(events[i], b);
    }
    return context;
  }

  void record_stream(Block* b, const Stream& s) {
    std::lock_guard<std::mutex> lk(mu_);
    if (!b->allocated || (s.device() == b->device && s.id() == b->stream)) return;
    if (std::find(b->stream_uses.begin(), b->stream_uses.end(), s) == b->stream_uses.end()) {
      b->stream_uses.push_back(s);
    }
  }

  void empty_cache() {
    std::unique_lock<std::mutex> lk(mu_);
    process_events();
    release_cached(lk);
  }

  void pool_hold(int64_t key, int64_t stream) {
    std::lock_guard<std::mutex> lk(mu_);
    Pool& p = pools_[key];
    if (p.holds++ == 0) p.stream = stream;
  }

  // The last hold gone: every block of the pool becomes a block of the pool's stream (free
  // ones move to that stream's free list).
  void pool_release(int64_t key) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = pools_.find(key);
    if (it == pools_.end() || --it->second.holds > 0) return;
    const int64_t stream = it->second.stream;
    pools_.erase(it);
    for (const auto& [base, head] : segments_) {
      if (head->stream != key) continue;
      for (Block* b = head; b != nullptr; b = b->next) {
        BlockPool& pool = b->small ? small_ : large_;
        const bool pooled = pool.erase(b) > 0;
        b->stream = stream;
        if (pooled) pool.insert(b);
      }
    }
  }

  DeviceStats stats() {
    std::lock_guard<std::mutex> lk(mu_);
    return stats_;
  }

  void reset_peak() {
    std::lock_guard<std::mutex> lk(mu_);
    for_each_stat(stats_, [](Stat& s) { s.peak = s.current; });
  }

  void reset_accumulated() {
    std::lock_guard<std::mutex> lk(mu_);
    for_each_stat(stats_, [](Stat& s) { s.allocated = s.freed = 0; });
    stats_.num_alloc_retries = stats_.num_ooms = stats_.num_sync_all_streams = 0;
    stats_.num_device_alloc = stats_.num_device_free = 0;
  }

  void set_limit(double fraction, uint64_t bytes) {
    std::lock_guard<std::mutex> lk(mu_);
    fraction_ = fraction;
    limit_ = bytes;
  }

  double fraction() {
    std::lock_guard<std::mutex> lk(mu_);
    return fraction_;
  }

  std::vector<SegmentInfo> snapshot() {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<SegmentInfo> out;
    for (const auto& [base, head] : segments_) {
      SegmentInfo seg;
      seg.device = device_;
      seg.address = base;
      seg.stream = head->stream;
      seg.is_large = !head->small;
      for (Block* b = head; b != nullptr; b = b->next) {
        BlockInfo bi;
        bi.address = reinterpret_cast<uint64_t>(b->ptr);
        bi.size = b->size;
        bi.requested_size = b->allocated ? b->requested : 0;
        bi.allocated = b->allocated;
        bi.active = b->allocated || b->event_count > 0;
        bi.context = b->allocated ? b->context : 0;
        seg.total_size += b->size;
        if (b->allocated) seg.allocated_size += b->size;
        seg.blocks.push_back(bi);
      }
      out.push_back(std::move(seg));
    }
    return out;
  }

  // The allocated block containing p, or nullptr.
  Block* find_allocated(const void* p) {
    std::lock_guard<std::mutex> lk(mu_);
    const auto addr = reinterpret_cast<uintptr_t>(p);
    auto it = segments_.upper_bound(addr);
    if (it == segments_.begin()) return nullptr;
    --it;
    for (Block* b = it->second; b != nullptr; b = b->next) {
      const auto start = reinterpret_cast<uintptr_t>(b->ptr);
      if (addr >= start && addr < start + b->size) return b->allocated ? b : nullptr;
    }
    return nullptr;
  }

 private:
  Block* take_free(BlockPool& pool, int64_t stream, size_t size) {
    Block key;
    key.stream = stream;
    key.size = size;
    auto it = pool.lower_bound(&key);
    if (it == pool.end() || (*it)->stream != stream) return nullptr;
    Block* b = *it;
    pool.erase(it);
    return b;
  }

  // A fresh segment for a block of `size` (one free block spanning it), or nullptr when the
  // device is full. A large request that does not fit its usual 20 MiB segment gets an exact one.
  // Past a memory fraction's limit (set_memory_fraction) the device counts as full.
  Block* new_segment(size_t size, int64_t stream, bool small) {
    size_t seg = segment_size(size);
    void* p = within_limit(seg) ? hal().mem_alloc(device_, seg) : nullptr;
    if (p == nullptr && !small && seg != size && within_limit(size)) {
      seg = size;
      p = hal().mem_alloc(device_, seg);
    }
    if (p == nullptr) return nullptr;
    auto* b = new Block;
    b->device = device_;
    b->stream = stream;
    b->size = seg;
    b->ptr = static_cast<char*>(p);
    b->small = small;
    segments_[reinterpret_cast<uintptr_t>(p)] = b;
    stat_update(stats_.segment, small, 1);
    stat_update(stats_.reserved_bytes, small, static_cast<int64_t>(seg));
    ++stats_.num_device_alloc;
    return b;
  }

  // Hands out the free block b (not pooled) for a request of `bytes` rounded to `size`,
  // splitting off the rest when it is big enough to be useful.
  void use_block(Block* b, size_t size, size_t bytes) {
    const bool already_split = b->is_split();
    const size_t rest = b->size - size;
    const bool split = b->small ? rest >= kMinBlockSize : rest > kSmallSize;
    if (split) {
      auto* r = new Block;
      r->device = device_;
      r->stream = b->stream;
      r->size = rest;
      r->ptr = b->ptr + size;
      r->small = b->small;
      r->prev = b;
      r->next = b->next;
      if (b->next != nullptr) b->next->prev = r;
      b->next = r;
      b->size = size;
      (b->small ? small_ : large_).insert(r);
      if (already_split) {
        stat_update(stats_.inactive_split_bytes, b->small, -static_cast<int64_t>(size));
      } else {
        stat_update(stats_.inactive_split, b->small, 1);
        stat_update(stats_.inactive_split_bytes, b->small, static_cast<int64_t>(rest));
      }
    } else if (already_split) {
      stat_update(stats_.inactive_split, b->small, -1);
      stat_update(stats_.inactive_split_bytes, b->small, -static_cast<int64_t>(b->size));
    }
    b->allocated = true;
    b->requested = bytes;
    stat_update(stats_.allocation, b->small, 1);
    stat_update(stats_.allocated_bytes, b->small, static_cast<int64_t>(b->size));
    stat_update(stats_.requested_bytes, b->small, static_cast<int64_t>(bytes));
    stat_update(stats_.active, b->small, 1);
    stat_update(stats_.active_bytes, b->small, static_cast<int64_t>(b->size));
  }

  // Returns the block (unallocated, no pending uses) to its pool, merged with free neighbours.
  void free_block(Block* b) {
    BlockPool& pool = b->small ? small_ : large_;
    const int64_t original = static_cast<int64_t>(b->size);
    int64_t net_blocks = 0, net_bytes = 0;
    for (Block* n : {b->prev, b->next}) {
      const size_t merged = merge(b, n, pool);
      if (merged > 0) {
        net_blocks -= 1;
        net_bytes -= static_cast<int64_t>(merged);
      }
    }
    pool.insert(b);
    if (b->is_split()) {
      net_blocks += 1;
      net_bytes += static_cast<int64_t>(b->size);
    }
    stat_update(stats_.inactive_split, b->small, net_blocks);
    stat_update(stats_.inactive_split_bytes, b->small, net_bytes);
    stat_update(stats_.active, b->small, -1);
    stat_update(stats_.active_bytes, b->small, -original);
  }

  // Absorbs the free neighbour n into b; returns the bytes absorbed (0 if n is busy).
  size_t merge(Block* b, Block* n, BlockPool& pool) {
    if (n == nullptr || n->allocated || n->event_count > 0) return 0;
    pool.erase(n);
    if (n == b->prev) {
      b->ptr = n->ptr;
      b->prev = n->prev;
      if (b->prev != nullptr) {
        b->prev->next = b;
      } else {
        segments_[reinterpret_cast<uintptr_t>(b->ptr)] = b;
      }
    } else {
      b->next = n->next;
      if (b->next != nullptr) b->next->prev = b;
    }
    const size_t absorbed = n->size;
    b->size += absorbed;
    delete n;
    return absorbed;
  }

  // Frees every cached segment that is entirely unused.
  // NOTE: a block is pooled as soon as its last tensor dies, while work already queued on its
  // stream may still use it (stream-ordered reuse, as in CUDA). Before memory goes back to the
  // HAL, the segments leave the pools (nobody can reuse them) and the device's queues drain
  // (everything that could still touch them has run), unlocked so executors never wait on us.
  void release_cached(std::unique_lock<std::mutex>& lk) {
    std::vector<Block*> segments;
    for (BlockPool* pool : {&small_, &large_}) {
      for (auto it = pool->begin(); it != pool->end();) {
        if ((*it)->is_split() || pools_.count((*it)->stream) != 0) {  // a held graph pool
          ++it;
          continue;
        }
        segments.push_back(*it);
        it = pool->erase(it);
      }
    }
    if (segments.empty()) return;
    ++stats_.num_sync_all_streams;
    lk.unlock();
    stream_drain_all(device_);
    lk.lock();
    for (Block* b : segments) {
      segments_.erase(reinterpret_cast<uintptr_t>(b->ptr));
      hal().mem_free(device_, b->ptr);
      stat_update(stats_.segment, b->small, -1);
      stat_update(stats_.reserved_bytes, b->small, -static_cast<int64_t>(b->size));
      ++stats_.num_device_free;
      delete b;
    }
  }

  // Frees blocks whose recorded streams have all reached their free, oldest first per stream.
  void process_events() {
    for (auto it = pending_.begin(); it != pending_.end();) {
      auto& q = it->second;
      while (!q.empty() && hal().event_query(q.front().first)) {
        auto [e, b] = q.front();
        q.pop_front();
        events_.push_back(e);
        if (--b->event_count == 0) free_block(b);
      }
      it = q.empty() ? pending_.erase(it) : std::next(it);
    }
  }

  // Waits (unlocked, without raising async errors) until every pending event is reached.
  void wait_pending(std::unique_lock<std::mutex>& lk) {
    ++stats_.num_sync_all_streams;
    std::vector<HalEvent*> wait;
    for (auto& [key, q] : pending_) {
      for (auto& [e, b] : q) wait.push_back(e);
    }
    lk.unlock();
    for (HalEvent* e : wait) {
      while (!hal().event_query(e)) std::this_thread::yield();
    }
    lk.lock();
  }

  bool within_limit(size_t seg) const {
    const int64_t reserved = stats_.reserved_bytes[kStatAggregate].current;
    return limit_ == kNoLimit || static_cast<uint64_t>(reserved) + seg <= limit_;
  }

  HalEvent* take_event() {
    if (events_.empty()) return hal().event_create(kEventDefault);
    HalEvent* e = events_.back();
    events_.pop_back();
    return e;
  }

  std::string oom_message(size_t bytes) const {
    const auto& agg_alloc = stats_.allocated_bytes[kStatAggregate].current;
    const auto& agg_res = stats_.reserved_bytes[kStatAggregate].current;
    const uint64_t capacity = hal().device_props(device_).total_memory;
    const std::string limit = limit_ == kNoLimit
                                  ? std::string()
                                  : "; this process is limited to " + format_bytes(limit_) +
                                        " by torch.neuron.set_per_process_memory_fraction";
    return "neuron:" + std::to_string(device_) + " out of memory: tried to allocate " +
           format_bytes(bytes) + " (in use " + format_bytes(static_cast<uint64_t>(agg_alloc)) +
           " of " + format_bytes(capacity) + " capacity, " +
           format_bytes(static_cast<uint64_t>(agg_res - agg_alloc)) + " cached" + limit +
           "). Free tensors, call torch.neuron.empty_cache(), or raise " +
           (limit_ == kNoLimit ? "OPENNEURON_DEVICE_MEMORY." : "the memory fraction.");
  }

  static constexpr uint64_t kNoLimit = ~uint64_t{0};

  const DeviceIndex device_;
  std::mutex mu_;
  DeviceStats stats_;
  BlockPool small_, large_;
  std::map<uintptr_t, Block*> segments_;  // segment base -> its first block
  std::map<std::pair<DeviceIndex, int64_t>, std::deque<std::pair<HalEvent*, Block*>>> pending_;
  std::vector<HalEvent*> events_;  // reached events for reuse
  uint64_t limit_ = kNoLimit;      // reserved bytes allowed (set_memory_fraction)
  struct Pool {
    int holds = 0;
    int64_t stream = 0;  // the stream its blocks join when released
  };
  std::map<int64_t, Pool> pools_;  // held graph pools, by block key (-pool id)
  double fraction_ = 1.0;          // what limit_ was set from
};

// Live pointer -> block, sharded to keep frees from different threads apart.
struct Shard {
  std::mutex mu;
  std::unordered_map<const void*, Block*> blocks;
};
constexpr size_t kShards = 16;

Shard& shard_of(const void* p) {
  static auto* shards = new Shard[kShards];
  const uint64_t h = reinterpret_cast<uintptr_t>(p) * 0x9E3779B97F4A7C15ull;
  return shards[h >> 60];
}

struct Caches {
  std::vector<std::unique_ptr<DeviceCache>> devices;
};

// NOTE: never destroyed (like the HAL): tensors may be freed during static destruction.
Caches& caches() {
  static Caches* c = [] {
    auto* cs = new Caches;
    for (int d = 0; d < device_count(); ++d) cs->devices.emplace_back(new DeviceCache(d));
    return cs;
  }();
  return *c;
}

DeviceCache& cache(DeviceIndex d) {
  Caches& c = caches();
  if (d < 0 || d >= static_cast<int>(c.devices.size())) device_check(d);
  return *c.devices[d];
}

Block* lookup(const void* p) {
  Shard& s = shard_of(p);
  std::lock_guard<std::mutex> lk(s.mu);
  auto it = s.blocks.find(p);
  return it == s.blocks.end() ? nullptr : it->second;
}

template <class F>
void for_devices(DeviceIndex d, F f) {
  if (d >= 0) {
    f(cache(d));
    return;
  }
  for (auto& c : caches().devices) f(*c);
}

}  // namespace

void* allocator_alloc(size_t bytes, const Stream& stream, uint64_t context) {
  if (bytes == 0) return nullptr;
  int64_t key = stream.id();
  if (const Graph* g = stream_capture_graph(stream)) key = -static_cast<int64_t>(g->pool());
  Block* b = cache(stream.device()).malloc(bytes, key, context);
  Shard& s = shard_of(b->ptr);
  std::lock_guard<std::mutex> lk(s.mu);
  s.blocks.emplace(b->ptr, b);
  return b->ptr;
}

uint64_t allocator_free(void* ptr) {
  if (ptr == nullptr) return 0;
  Block* b = nullptr;
  {
    Shard& s = shard_of(ptr);
    std::lock_guard<std::mutex> lk(s.mu);
    auto it = s.blocks.find(ptr);
    if (it != s.blocks.end()) {
      b = it->second;
      s.blocks.erase(it);
    }
  }
  if (b == nullptr) {
    throw DeviceError(
        "allocator_free: pointer was not returned by the neuron caching allocator or was "
        "already freed");
  }
  return cache(b->device).free(b);
}

void allocator_record_stream(void* ptr, const Stream& s) {
  if (ptr == nullptr) return;
  Block* b = lookup(ptr);
  if (b == nullptr) {
    for (auto& c : caches().devices) {
      if ((b = c->find_allocated(ptr)) != nullptr) break;
    }
  }
  if (b == nullptr) {
    throw DeviceError("record_stream: pointer is not inside a live neuron allocation");
  }
  cache(b->device).record_stream(b, s);
}

void allocator_empty_cache(DeviceIndex d) {
  for_devices(d, [](DeviceCache& c) { c.empty_cache(); });
}

DeviceStats allocator_stats(DeviceIndex d) { return cache(d).stats(); }

void allocator_pool_hold(const Stream& s, uint64_t pool) {
  cache(s.device()).pool_hold(-static_cast<int64_t>(pool), s.id());
}

void allocator_pool_release(DeviceIndex d, uint64_t pool) {
  cache(d).pool_release(-static_cast<int64_t>(pool));
}

void allocator_set_memory_fraction(double fraction, DeviceIndex d) {
  if (!(fraction >= 0.0 && fraction <= 1.0)) {
    throw DeviceError("set_per_process_memory_fraction: fraction " + std::to_string(fraction) +
                      " is outside [0, 1]");
  }
  DeviceCache& c = cache(d);
  const uint64_t capacity = hal().device_props(d).total_memory;
  c.set_limit(fraction, static_cast<uint64_t>(fraction * static_cast<double>(capacity)));
}

double allocator_memory_fraction(DeviceIndex d) { return cache(d).fraction(); }

void allocator_reset_peak(DeviceIndex d) {
  for_devices(d, [](DeviceCache& c) { c.reset_peak(); });
}

void allocator_reset_accumulated(DeviceIndex d) {
  for_devices(d, [](DeviceCache& c) { c.reset_accumulated(); });
}

std::vector<SegmentInfo> allocator_snapshot(DeviceIndex d) {
  std::vector<SegmentInfo> out;
  for_devices(d, [&](DeviceCache& c) {
    auto segs = c.snapshot();
    out.insert(out.end(), std::make_move_iterator(segs.begin()),
               std::make_move_iterator(segs.end()));
  });
  return out;
}

DeviceIndex allocator_device_of(const void* ptr) {
  if (ptr == nullptr) return -1;
  if (Block* b = lookup(ptr)) return b->device;
  for (auto& c : caches().devices) {
    if (Block* b = c->find_allocated(ptr)) return b->device;
  }
  return -1;
}

}  // namespace openneuron::runtime
