// Pinned host memory: the staging memory for asynchronous host<->device copies
// (tensor.pin_memory(), non_blocking=True). Cached by size; a freed block is reused only
// after every stream recorded for it has reached its recording point. thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

#include "stream.h"

namespace openneuron::runtime {

struct HostStats {
  int64_t allocated_bytes = 0;  // in blocks handed out
  int64_t reserved_bytes = 0;   // held, including cached free blocks
  int64_t num_allocs = 0;
  int64_t num_frees = 0;
};

// Page-aligned host memory of at least `bytes`; nullptr for 0. Throws Error if the host is out
// of memory.
void* host_alloc(size_t bytes);
void host_free(void* ptr);
// Marks that work on s (a copy) uses the block containing ptr.
void host_record_stream(void* ptr, const Stream& s);
// True if ptr points into a live block from host_alloc (any address inside it).
bool host_is_pinned(const void* ptr);
void host_empty_cache();
HostStats host_stats();

}  // namespace openneuron::runtime
