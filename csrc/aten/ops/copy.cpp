// Copies to, from and between neuron devices (_copy_from, _copy_from_and_resize) and
// _local_scalar_dense. Everything is stream-ordered: host-to-device copies return at once
// (pinned sources directly, others through a pinned staging block); device-to-host copies are
// sync points unless non_blocking into pinned memory; conversions and strided copies run ATen's
// CPU copy_ inside a work item on zero-copy CPU views of device memory.
#include <ATen/MemoryOverlap.h>
#include <ATen/ops/_local_scalar_dense_native.h>
#include <ATen/ops/copy_native.h>
#include <Python.h>
#include <c10/util/SmallVector.h>
#include <pybind11/pybind11.h>
#include <torch/library.h>

#include <cstring>

#include "aten/errors.h"
#include "aten/fusion/fusion.h"
#include "aten/ops/enqueue.h"
#include "aten/streams.h"
#include "runtime/caching_allocator.h"
#include "runtime/event.h"
#include "runtime/host_allocator.h"

namespace openneuron::aten {
namespace {

using runtime::CopyKind;

// What a work item needs to rebuild a CPU view of a tensor. It does not own the memory: as on
// CUDA, stream order keeps a freed block's reuse after queued work (caching_allocator.h).
struct HostView {
  void* data = nullptr;
  c10::SmallVector<int64_t, 5> sizes;
  c10::SmallVector<int64_t, 5> strides;
  c10::ScalarType dtype = c10::ScalarType::Float;
  bool conj = false;
  bool neg = false;
};

HostView host_view_of(const at::Tensor& t) {
  HostView v;
  v.data = t.data_ptr();
  v.sizes.assign(t.sizes().begin(), t.sizes().end());
  v.strides.assign(t.strides().begin(), t.strides().end());
  v.dtype = t.scalar_type();
  v.conj = t.is_conj();
  v.neg = t.is_neg();
  return v;
}

at::Tensor as_cpu(const HostView& v) {
  at::Tensor t = at::from_blob(v.data, v.sizes, v.strides,
                               at::TensorOptions().dtype(v.dtype).device(at::kCPU));
  t._set_conj(v.conj);
  t._set_neg(v.neg);
  return t;
}

// Blocking waits must not hold the GIL: work items may need it (e.g. to release Python-owned
// storages).
template <class F>
void without_gil(F&& f) {
  if (Py_IsInitialized() && PyGILState_Check()) {
    pybind11::gil_scoped_release no_gil;
    f();
  } else {
    f();
  }
}

// Same bytes in the same layout: the copy is one flat memcpy.
bool raw_compatible(const at::Tensor& dst, const at::Tensor& src) {
  return dst.scalar_type() == src.scalar_type() && dst.sizes() == src.sizes() &&
         dst.strides() == src.strides() && dst.is_non_overlapping_and_dense() &&
         dst.is_conj() == src.is_conj() && dst.is_neg() == src.is_neg();
}

size_t nbytes_of(const at::Tensor& t) { return static_cast<size_t>(t.numel()) * t.itemsize(); }

// ATen's CPU copy_ over views of both tensors, enqueued on `stream`.
void enqueue_strided_copy(const runtime::Stream& stream, const at::Tensor& dst,
                          const at::Tensor& src) {
  enqueue_op(stream, "aten::copy_", [d = host_view_of(dst), s = host_view_of(src)] {
    at::Tensor out = as_cpu(d);
    at::native::copy_(out, as_cpu(s), false);
  });
}

void copy_same_device(const at::Tensor& dst, const at::Tensor& src) {
  runtime::Stream stream = current_runtime_stream(dst.device().index());
  if (raw_compatible(dst, src)) {
    stream.memcpy(dst.data_ptr(), src.data_ptr(), nbytes_of(dst), CopyKind::DeviceToDevice);
  } else {
    enqueue_strided_copy(stream, dst, src);
  }
}

// Flat copy between devices, ordered both ways as CUDA's peer copies: the copy waits for the
// destination's current stream, and the destination's current stream waits for the copy.
void copy_cross_device_raw(const at::Tensor& dst, const at::Tensor& src) {
  runtime::Stream src_stream = current_runtime_stream(src.device().index());
  runtime::Stream dst_stream = current_runtime_stream(dst.device().index());
  runtime::Event before;
  before.record(dst_stream);
  before.block(src_stream);
  src_stream.memcpy(dst.data_ptr(), src.data_ptr(), nbytes_of(dst), CopyKind::DeviceToDevice);
  runtime::allocator_record_stream(dst.data_ptr(), src_stream);
  runtime::Event after;
  after.record(src_stream);
  after.block(dst_stream);
}

at::Tensor contiguous_temp(const at::Tensor& like, c10::ScalarType dtype, c10::Device device) {
  return at::empty(like.sizes(), like.options().dtype(dtype).device(device));
}

void copy_cross_device(const at::Tensor& dst, const at::Tensor& src) {
  if (raw_compatible(dst, src)) return copy_cross_device_raw(dst, src);
  at::Tensor from = src;
  if (!(src.is_contiguous() && !src.is_conj() && !src.is_neg())) {
    from = contiguous_temp(src, src.scalar_type(), src.device());
    copy_same_device(from, src);
  }
  if (dst.scalar_type() == from.scalar_type() && dst.is_contiguous() && !dst.is_conj() &&
      !dst.is_neg()) {
    return copy_cross_device_raw(dst, from);
  }
  at::Tensor staged = contiguous_temp(dst, from.scalar_type(), dst.device());
  copy_cross_device_raw(staged, from);
  copy_same_device(dst, staged);
}

// Host to device, same layout. Returns at once: a pinned source (non_blocking) is read by the
// stream directly; any other source is first copied into a pinned staging block.
void copy_h2d_raw(const at::Tensor& dst, const at::Tensor& src, bool non_blocking) {
  runtime::Stream stream = current_runtime_stream(dst.device().index());
  const size_t n = nbytes_of(dst);
  void* host = src.data_ptr();
  if (non_blocking && runtime::host_is_pinned(host)) {
    stream.memcpy(dst.data_ptr(), host, n, CopyKind::HostToDevice);
    runtime::host_record_stream(host, stream);
    return;
  }
  void* staging = runtime::host_alloc(n);
  std::memcpy(staging, host, n);
  stream.memcpy(dst.data_ptr(), staging, n, CopyKind::HostToDevice);
  // NOTE: the runtime reuses a freed pinned block only after every recorded stream has passed
  // its recording point, so freeing right away is safe.
  runtime::host_record_stream(staging, stream);
  runtime::host_free(staging);
}

void copy_h2d(const at::Tensor& dst, const at::Tensor& src, bool non_blocking) {
  if (raw_compatible(dst, src)) return copy_h2d_raw(dst, src, non_blocking);
  at::Tensor host = src.resolve_conj().resolve_neg().contiguous();
  if (dst.scalar_type() == host.scalar_type() && dst.is_contiguous() && !dst.is_conj() &&
      !dst.is_neg()) {
    return copy_h2d_raw(dst, host, false);
  }
  at::Tensor staged = contiguous_temp(dst, host.scalar_type(), dst.device());
  copy_h2d_raw(staged, host, false);
  copy_same_device(dst, staged);
}

// Device to host: a sync point unless non_blocking into pinned memory.
void copy_d2h(const at::Tensor& dst, const at::Tensor& src, bool non_blocking) {
  runtime::Stream stream = current_runtime_stream(src.device().index());
  if (raw_compatible(dst, src)) {
    stream.memcpy(dst.data_ptr(), src.data_ptr(), nbytes_of(dst), CopyKind::DeviceToHost);
  } else {
    enqueue_strided_copy(stream, dst, src);
  }
  void* host = dst.storage().mutable_data();
  if (non_blocking && runtime::host_is_pinned(host)) {
    runtime::host_record_stream(host, stream);
    return;
  }
  without_gil([&] { stream.synchronize(); });
}

void check_copy_devices(const at::Tensor& src, const at::Tensor& dst) {
  auto ok = [](const at::Tensor& t) { return t.is_cpu() || t.is_privateuseone(); };
  TORCH_CHECK(ok(src) && ok(dst), "copy_: neuron copies support cpu and neuron tensors, got ",
              src.device(), " -> ", dst.device());
  TORCH_CHECK(src.layout() == c10::kStrided && dst.layout() == c10::kStrided,
              "copy_: only strided neuron tensors can be copied, got ", src.layout(), " -> ",
              dst.layout());
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  check_copy_devices(self, dst);
  if (dst.numel() == 0) return dst;
  at::Tensor src = self.sizes() == dst.sizes() ? self : self.expand(dst.sizes());
  at::assert_no_internal_overlap(dst);
  if (src.device() == dst.device()) at::assert_no_partial_overlap(dst, src);
  with_torch_errors([&] {
    if (src.is_privateuseone() && dst.is_privateuseone()) {
      if (src.device() == dst.device()) {
        // Adaptive eager: a cast is recorded into the pending group.
        if (!(fusion::enabled() && fusion::try_record_copy(dst, src))) copy_same_device(dst, src);
      } else {
        copy_cross_device(dst, src);
      }
    } else if (dst.is_privateuseone()) {
      copy_h2d(dst, src, non_blocking);
    } else {
      copy_d2h(dst, src, non_blocking);
    }
  });
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  return copy_from(self, dst, false);
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  TORCH_CHECK(self.numel() == 1, "a neuron Tensor with ", self.numel(),
              " elements cannot be converted to Scalar");
  at::Tensor host = at::empty({}, self.options().device(at::kCPU));
  with_torch_errors([&] {
    runtime::Stream stream = current_runtime_stream(self.device().index());
    stream.memcpy(host.data_ptr(), self.data_ptr(), self.itemsize(), CopyKind::DeviceToHost);
    without_gil([&] { stream.synchronize(); });
  });
  host._set_conj(self.is_conj());
  host._set_neg(self.is_neg());
  return at::native::_local_scalar_dense_cpu(host.resolve_conj().resolve_neg());
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_copy_from", TORCH_FN(copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  m.impl("_local_scalar_dense", TORCH_FN(local_scalar_dense));
}

// NOTE: _copy_from honours conj/neg bits itself (the CPU views carry them). Without these
// fallthroughs the Conjugate/Negative fallbacks would materialize the source with clone, which
// copies through _copy_from again: infinite recursion.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

}  // namespace openneuron::aten
