// The neuron device allocator as c10 sees it: a c10::DeviceAllocator over the runtime's caching
// allocator (allocator.cpp), plus the storage helpers that must stay stream-ordered (resize).
// Not the caching logic itself (csrc/runtime/caching_allocator.cpp) nor pinned host memory
// (host_allocator.cpp).
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/Storage.h>
#include <c10/core/Stream.h>

#include <cstddef>

namespace openneuron::aten {

// The registered PrivateUse1 allocator (also at::GetAllocator(at::kPrivateUse1)).
c10::Allocator* device_allocator();

// Tells the caching allocator that work on `stream` uses the block behind data_ptr.
// A null or foreign pointer is ignored.
void allocator_record_data_ptr(const c10::DataPtr& data_ptr, const c10::Stream& stream);

// Resizes a neuron storage to new_bytes, keeping min(old, new) bytes of contents. The copy is
// enqueued on the current stream of the storage's device (asynchronous). Used by resize_ and the
// resizePrivateUse1Bytes hook.
void storage_resize_bytes(const c10::Storage& storage, size_t new_bytes);

}  // namespace openneuron::aten
