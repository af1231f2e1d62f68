// Pinned host memory for asynchronous copies: page-aligned blocks in power-of-two size classes,
// cached after free; a block recorded on streams (host_record_stream) is reused only after
// those streams have reached the free. One mutex; nothing here touches Python.
#include "host_allocator.h"

#include <sys/mman.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "config.h"
#include "errors.h"

namespace openneuron::runtime {
namespace {

constexpr size_t kPageSize = 4096;

size_t size_class(size_t bytes) {
  size_t s = kPageSize;
  while (s < bytes) s <<= 1;
  return s;
}

struct HostBlock {
  char* ptr = nullptr;
  size_t size = 0;
  bool allocated = false;
  int event_count = 0;
  std::vector<Stream> uses;
};

class HostCache {
 public:
  void* alloc(size_t bytes) {
    const size_t size = size_class(bytes);
    std::lock_guard<std::mutex> lk(mu_);
    process_events();
    HostBlock* b = nullptr;
    auto it = free_.find(size);
    if (it != free_.end()) {
      b = it->second;
      free_.erase(it);
    } else {
      void* p = map(size);
      if (p == nullptr) {
        release_cached();
        p = map(size);
      }
      if (p == nullptr) {
        throw Error("host out of memory: could not allocate " + format_bytes(size) +
                    " of pinned memory (" + format_bytes(stats_.reserved_bytes) +
                    " already held). Free pinned tensors or use smaller batches.");
      }
      b = new HostBlock;
      b->ptr = static_cast<char*>(p);
      b->size = size;
      blocks_.emplace(reinterpret_cast<uintptr_t>(p), b);
      stats_.reserved_bytes += static_cast<int64_t>(size);
    }
    b->allocated = true;
    stats_.allocated_bytes += static_cast<int64_t>(size);
    ++stats_.num_allocs;
    return b->ptr;
  }

  void free(void* p) {
    std::vector<Stream> uses;
    std::vector<HalEvent*> events;
    HostBlock* b = nullptr;
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto it = blocks_.find(reinterpret_cast<uintptr_t>(p));
      if (it == blocks_.end() || !it->second->allocated) {
        throw Error("host_free: pointer was not returned by host_alloc or was already freed");
      }
      b = it->second;
      b->allocated = false;
      stats_.allocated_bytes -= static_cast<int64_t>(b->size);
      ++stats_.num_frees;
      if (b->uses.empty()) {
        free_.emplace(b->size, b);
        return;
      }
      uses.swap(b->uses);
      b->event_count = static_cast<int>(uses.size());
      for (size_t i = 0; i < uses.size(); ++i) events.push_back(take_event());
    }
    // NOTE: recorded unlocked, as in caching_allocator.cpp: a HAL may block in event_record.
    for (size_t i = 0; i < uses.size(); ++i) hal().event_record(events[i], uses[i].hal_stream());
    std::lock_guard<std::mutex> lk(mu_);
    for (HalEvent* e : events) pending_.emplace_back(e, b);
  }

  void record_stream(const void* p, const Stream& s) {
    std::lock_guard<std::mutex> lk(mu_);
    HostBlock* b = containing(p);
    if (b == nullptr) return;
    if (std::find(b->uses.begin(), b->uses.end(), s) == b->uses.end()) b->uses.push_back(s);
  }

  bool is_pinned(const void* p) {
    std::lock_guard<std::mutex> lk(mu_);
    return containing(p) != nullptr;
  }

  void empty_cache() {
    std::lock_guard<std::mutex> lk(mu_);
    process_events();
    release_cached();
  }

  HostStats stats() {
    std::lock_guard<std::mutex> lk(mu_);
    return stats_;
  }

 private:
  static void* map(size_t size) {
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? nullptr : p;
  }

  // The allocated block containing p, or nullptr.
  HostBlock* containing(const void* p) {
    const auto addr = reinterpret_cast<uintptr_t>(p);
    auto it = blocks_.upper_bound(addr);
    if (it == blocks_.begin()) return nullptr;
    HostBlock* b = std::prev(it)->second;
    const auto start = reinterpret_cast<uintptr_t>(b->ptr);
    return (b->allocated && addr < start + b->size) ? b : nullptr;
  }

  void process_events() {
    auto reached = [&](std::pair<HalEvent*, HostBlock*>& pe) {
      if (!hal().event_query(pe.first)) return false;
      events_.push_back(pe.first);
      HostBlock* b = pe.second;
      if (--b->event_count == 0) free_.emplace(b->size, b);
      return true;
    };
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(), reached), pending_.end());
  }

  void release_cached() {
    for (auto& [size, b] : free_) {
      blocks_.erase(reinterpret_cast<uintptr_t>(b->ptr));
      ::munmap(b->ptr, b->size);
      stats_.reserved_bytes -= static_cast<int64_t>(b->size);
      delete b;
    }
    free_.clear();
  }

  HalEvent* take_event() {
    if (events_.empty()) return hal().event_create(kEventDefault);
    HalEvent* e = events_.back();
    events_.pop_back();
    return e;
  }

  std::mutex mu_;
  HostStats stats_;
  std::map<uintptr_t, HostBlock*> blocks_;  // every block held, by address
  std::multimap<size_t, HostBlock*> free_;  // cached blocks by size class
  std::vector<std::pair<HalEvent*, HostBlock*>> pending_;
  std::vector<HalEvent*> events_;
};

// NOTE: never destroyed (like the HAL): pinned tensors may be freed during static destruction.
HostCache& host_cache() {
  static auto* c = new HostCache;
  return *c;
}

}  // namespace

void* host_alloc(size_t bytes) { return bytes == 0 ? nullptr : host_cache().alloc(bytes); }

void host_free(void* ptr) {
  if (ptr != nullptr) host_cache().free(ptr);
}

void host_record_stream(void* ptr, const Stream& s) {
  if (ptr != nullptr) host_cache().record_stream(ptr, s);
}

bool host_is_pinned(const void* ptr) { return ptr != nullptr && host_cache().is_pinned(ptr); }

void host_empty_cache() { host_cache().empty_cache(); }

HostStats host_stats() { return host_cache().stats(); }

}  // namespace openneuron::runtime
