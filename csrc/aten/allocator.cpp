// The PrivateUse1 c10::DeviceAllocator: hands out blocks of the runtime caching allocator on
// the current device and stream, maps its statistics to c10's DeviceStats (so the
// torch.accelerator.memory_* calls work), records allocation stacks while memory history is on
// (origin_capture.h keeps them; the runtime only holds each block's id), writes the
// OPENNEURON_OOM_SNAPSHOT file on out-of-memory, and binds _memory_snapshot, _record_memory_history
// and _host_memory_stats. Takes the GIL only for those two (history on, or an out-of-memory
// error). Pinned host memory is host_allocator.cpp.
#include "aten/allocator.h"

#include <Python.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>

#include "aten/bindings.h"
#include "aten/device.h"
#include "aten/errors.h"
#include "aten/origin_capture.h"
#include "aten/streams.h"
#include "runtime/caching_allocator.h"
#include "runtime/config.h"
#include "runtime/host_allocator.h"

namespace openneuron::aten {
namespace {

namespace py = pybind11;
using C10Stats = c10::CachingDeviceAllocator::DeviceStats;

// NOTE: the only per-allocation cost of memory history when it is off: one relaxed load.
std::atomic<bool> g_record_history{false};

const std::string& oom_snapshot_path() { return runtime::config_or_defaults().oom_snapshot; }

// Writes the OOM snapshot (Python: openneuron.neuron.memory._dump_oom_snapshot) and returns the
// sentence to append to the error. Only on a Python thread: an executor thread must never wait
// for the GIL (the thread holding it may be waiting for that executor).
std::string oom_snapshot_write(int device, size_t bytes) {
  const std::string& path = oom_snapshot_path();
  if (path.empty() || !Py_IsInitialized()) return "";
  if (!PyGILState_Check() && PyGILState_GetThisThreadState() == nullptr) return "";
  py::gil_scoped_acquire gil;
  try {
    py::module_::import("openneuron.neuron.memory").attr("_dump_oom_snapshot")(path, device, bytes);
    return " Memory snapshot written to " + path +
           " (open it at https://pytorch.org/memory_viz or with torch.cuda._memory_viz).";
  } catch (py::error_already_set& e) {
    return " Writing the memory snapshot to " + path + " failed: " + e.what();
  }
}

void* allocate_block(size_t bytes, int device) {
  const uint64_t context = g_record_history.load(std::memory_order_relaxed) ? stack_capture() : 0;
  try {
    return runtime::allocator_alloc(bytes, runtime::stream_current(device), context);
  } catch (const runtime::OutOfMemoryError& e) {
    stack_release(context);
    const std::string message = e.what() + oom_snapshot_write(device, bytes);
    TORCH_CHECK_WITH(OutOfMemoryError, false, message);
  } catch (const runtime::Error& e) {
    stack_release(context);
    TORCH_CHECK(false, e.what());
  }
}

void delete_block(void* ptr) {
  try {
    stack_release(runtime::allocator_free(ptr));
  } catch (...) {
    // NOTE: a deleter runs inside destructors and must not throw; allocator_free only throws
    // for a foreign pointer, which would be a bug caught by the runtime's own tests.
  }
}

void copy_stat(c10::CachingAllocator::Stat& to, const runtime::Stat& from) {
  to.current = from.current;
  to.peak = from.peak;
  to.allocated = from.allocated;
  to.freed = from.freed;
}

void copy_stats(c10::CachingAllocator::StatArray& to, const runtime::StatArray& from) {
  for (size_t i = 0; i < from.size(); ++i) copy_stat(to[i], from[i]);
}

class NeuronAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t bytes) override {
    const int device = with_torch_errors([] { return runtime::device_current(); });
    void* ptr = allocate_block(bytes, device);
    return {ptr, ptr, &delete_block, neuron_device(device)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &delete_block; }

  // Stream-ordered device-to-device copy on the current stream of dest's device.
  void copy_data(void* dest, const void* src, size_t count) const override {
    if (count == 0) return;
    with_torch_errors([&] {
      int device = runtime::allocator_device_of(dest);
      if (device < 0) device = runtime::device_current();
      runtime::stream_current(device).memcpy(dest, src, count, runtime::CopyKind::DeviceToDevice);
    });
  }

  bool initialized() override { return runtime_initialized(); }

  void emptyCache(c10::MempoolId_t) override {
    with_torch_errors([] { runtime::allocator_empty_cache(-1); });
  }

  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override {
    allocator_record_data_ptr(ptr, stream);
  }

  C10Stats getDeviceStats(c10::DeviceIndex device) override {
    runtime::DeviceStats s =
        with_torch_errors([&] { return runtime::allocator_stats(resolve_device(device)); });
    C10Stats out;
    copy_stats(out.allocation, s.allocation);
    copy_stats(out.segment, s.segment);
    copy_stats(out.active, s.active);
    copy_stats(out.inactive_split, s.inactive_split);
    copy_stats(out.allocated_bytes, s.allocated_bytes);
    copy_stats(out.reserved_bytes, s.reserved_bytes);
    copy_stats(out.active_bytes, s.active_bytes);
    copy_stats(out.inactive_split_bytes, s.inactive_split_bytes);
    copy_stats(out.requested_bytes, s.requested_bytes);
    out.num_alloc_retries = s.num_alloc_retries;
    out.num_ooms = s.num_ooms;
    out.num_sync_all_streams = s.num_sync_all_streams;
    out.num_device_alloc = s.num_device_alloc;
    out.num_device_free = s.num_device_free;
    copy_stat(out.oversize_allocations, s.oversize_allocations);
    copy_stat(out.oversize_segments, s.oversize_segments);
    out.max_split_size = s.max_split_size;
    return out;
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    with_torch_errors([&] { runtime::allocator_reset_accumulated(resolve_device(device)); });
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    with_torch_errors([&] { runtime::allocator_reset_peak(resolve_device(device)); });
  }

  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    return with_torch_errors([&] {
      uint64_t free = 0, total = 0;
      runtime::hal().memory_info(resolve_device(device), &free, &total);
      return std::pair<size_t, size_t>(free, total);
    });
  }
};

NeuronAllocator g_allocator;
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_allocator);

py::list memory_snapshot(int device) {
  std::vector<runtime::SegmentInfo> segments = with_torch_errors([&] {
    if (device >= 0) return runtime::allocator_snapshot(device);
    std::vector<runtime::SegmentInfo> all;
    for (int d = 0; d < runtime::device_count(); ++d) {
      auto part = runtime::allocator_snapshot(d);
      all.insert(all.end(), part.begin(), part.end());
    }
    return all;
  });
  py::list out;
  for (const auto& seg : segments) {
    py::list blocks;
    for (const auto& b : seg.blocks) {
      py::dict block;
      block["address"] = b.address;
      block["size"] = b.size;
      block["requested_size"] = b.requested_size;
      block["allocated"] = b.allocated;
      block["active"] = b.active;
      block["state"] = b.allocated ? "active_allocated"
                       : b.active  ? "active_pending_free"
                                   : "inactive";
      py::list frames;
      for (const StackFrame& f : stack_frames(b.context)) {
        py::dict frame;
        frame["filename"] = f.filename;
        frame["line"] = f.line;
        frame["name"] = f.name;
        frames.append(frame);
      }
      block["frames"] = frames;
      blocks.append(block);
    }
    py::dict d;
    d["device"] = seg.device;
    d["address"] = seg.address;
    d["total_size"] = seg.total_size;
    d["allocated_size"] = seg.allocated_size;
    d["stream"] = seg.stream;
    d["is_large"] = seg.is_large;
    d["blocks"] = blocks;
    out.append(d);
  }
  return out;
}

void record_memory_history(bool enabled, size_t max_entries, bool clear) {
  stack_configure(max_entries, clear);
  g_record_history.store(enabled, std::memory_order_relaxed);
}

py::dict host_memory_stats() {
  runtime::HostStats s = with_torch_errors([] { return runtime::host_stats(); });
  py::dict d;
  d["allocated_bytes"] = s.allocated_bytes;
  d["reserved_bytes"] = s.reserved_bytes;
  d["num_allocs"] = s.num_allocs;
  d["num_frees"] = s.num_frees;
  return d;
}

}  // namespace

c10::Allocator* device_allocator() { return &g_allocator; }

void allocator_record_data_ptr(const c10::DataPtr& data_ptr, const c10::Stream& stream) {
  void* ptr = data_ptr.get();
  if (ptr == nullptr || data_ptr.get_deleter() != &delete_block) return;
  with_torch_errors([&] { runtime::allocator_record_stream(ptr, to_runtime(stream)); });
}

void storage_resize_bytes(const c10::Storage& storage, size_t new_bytes) {
  TORCH_CHECK(storage.resizable(), "Trying to resize a neuron storage that is not resizable.");
  c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  const size_t old_bytes = impl->nbytes();
  if (new_bytes == old_bytes) return;
  c10::DeviceIndex device =
      impl->data_ptr().device().is_privateuseone() ? impl->data_ptr().device().index() : -1;
  c10::DeviceGuard guard(neuron_device(resolve_device(device)));
  c10::DataPtr fresh = new_bytes == 0 ? c10::DataPtr(nullptr, neuron_device(resolve_device(device)))
                                      : g_allocator.allocate(new_bytes);
  const size_t keep = std::min(old_bytes, new_bytes);
  if (keep > 0 && impl->data() != nullptr) {
    g_allocator.copy_data(fresh.get(), impl->data(), keep);
    // NOTE: the old block is freed below while the copy may still be queued: keep the
    // allocator from reusing it before the current stream has read it.
    allocator_record_data_ptr(impl->data_ptr(),
                              to_c10(runtime::stream_current(resolve_device(device))));
  }
  impl->set_data_ptr_noswap(std::move(fresh));
  impl->set_nbytes(new_bytes);
}

void bind_memory(py::module_& m) {
  m.def("_memory_snapshot", &memory_snapshot, py::arg("device") = -1,
        "Segments and blocks of device's caching allocator (-1: every device).");
  m.def("_record_memory_history", &record_memory_history, py::arg("enabled"),
        py::arg("max_entries"), py::arg("clear"),
        "Turns allocation-stack recording on or off; at most max_entries distinct live stacks.");
  m.def(
      "_memory_history_enabled", [] { return g_record_history.load(std::memory_order_relaxed); },
      "Whether allocation stacks are being recorded.");
  m.def("_memory_history_entries", &stack_entries, "Live interned allocation stacks.");
  m.def("_host_memory_stats", &host_memory_stats, "Pinned host memory statistics.");
  m.def(
      "_set_memory_fraction",
      [](double fraction, int device) {
        with_torch_errors([&] { runtime::allocator_set_memory_fraction(fraction, device); });
      },
      py::arg("fraction"), py::arg("device"),
      "Limits the device's reserved memory to fraction * capacity.");
  m.def(
      "_memory_fraction",
      [](int device) {
        return with_torch_errors([&] { return runtime::allocator_memory_fraction(device); });
      },
      py::arg("device"), "The fraction set by _set_memory_fraction (1.0 until set).");
  // NOTE: an OOM snapshot without allocation stacks would not say who holds the memory.
  if (!oom_snapshot_path().empty()) g_record_history.store(true, std::memory_order_relaxed);
}

}  // namespace openneuron::aten
