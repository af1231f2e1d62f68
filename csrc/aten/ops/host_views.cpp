// Zero-copy CPU/meta re-typings of neuron tensors and device tensor construction from a
// geometry. See host_views.h.
#include "aten/ops/host_views.h"

#include <ATen/EmptyTensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceGuard.h>

#include "runtime/device.h"

namespace openneuron::aten {

TensorGeom geom_of(const at::Tensor& t) {
  TensorGeom g;
  if (!t.defined()) return g;
  g.defined = true;
  g.sizes.assign(t.sizes().begin(), t.sizes().end());
  g.strides.assign(t.strides().begin(), t.strides().end());
  g.offset = t.storage_offset();
  g.dtype = t.scalar_type();
  g.conj = t.is_conj();
  g.neg = t.is_neg();
  return g;
}

DeviceBuffer buffer_of(const at::Tensor& t) {
  const c10::StorageImpl* si = t.storage().unsafeGetStorageImpl();
  return DeviceBuffer{const_cast<void*>(si->data_ptr().get()), si->nbytes()};
}

bool same_geom(const TensorGeom& g, const at::Tensor& t) {
  return t.sizes().equals(g.sizes) && t.strides().equals(g.strides) &&
         t.storage_offset() == g.offset && t.scalar_type() == g.dtype;
}

at::Tensor StorageMap::view_of(const at::Tensor& t) {
  return view_of(buffer_of(t), geom_of(t), &t.storage());
}

at::Tensor StorageMap::view_of(const DeviceBuffer& buffer, const TensorGeom& g) {
  return view_of(buffer, g, nullptr);
}

at::Tensor StorageMap::view_of(const DeviceBuffer& buffer, const TensorGeom& g,
                               const c10::Storage* source) {
  c10::Storage* mapped = nullptr;
  // NOTE: empty storages all have a null data pointer; each gets its own re-typed storage (a
  // kernel may resize one empty output without touching another).
  if (buffer.data != nullptr) {
    for (auto& e : map_)
      if (e.key == buffer.data) mapped = &e.mapped;
  }
  if (!mapped) {
    size_t nbytes = buffer.nbytes;
    c10::Storage st;
    if (target_ == c10::DeviceType::Meta) {
      st = c10::Storage(c10::Storage::use_byte_size_t(), nbytes,
                        c10::DataPtr(nullptr, c10::Device(c10::DeviceType::Meta)),
                        c10::GetAllocator(c10::DeviceType::Meta), /*resizable=*/true);
    } else {
      void* data = buffer.data;
      // NOTE: resizable with the CPU allocator: a CPU kernel that grows an output moves it to
      // host memory; the caller copies such outputs back (fallback.cpp, Launch::fix_output).
      st = c10::Storage(c10::Storage::use_byte_size_t(), nbytes,
                        c10::DataPtr(data, c10::Device(c10::DeviceType::CPU)),
                        c10::GetCPUAllocator(), /*resizable=*/true);
    }
    c10::Storage kept = keep_sources_ && source ? *source : c10::Storage();
    map_.push_back(Entry{buffer.data, std::move(kept), std::move(st)});
    mapped = &map_.back().mapped;
  }
  c10::DispatchKey key =
      target_ == c10::DeviceType::Meta ? c10::DispatchKey::Meta : c10::DispatchKey::CPU;
  auto out = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(*mapped), c10::DispatchKeySet(key), c10::scalarTypeToTypeMeta(g.dtype));
  out.unsafeGetTensorImpl()->set_sizes_and_strides(g.sizes, g.strides, g.offset);
  if (g.conj) out._set_conj(true);
  if (g.neg) out._set_neg(true);
  return out;
}

at::Tensor host_view_fresh(const DeviceBuffer& buffer, const TensorGeom& g) {
  c10::Storage st(c10::Storage::use_byte_size_t(), buffer.nbytes,
                  c10::DataPtr(buffer.data, c10::Device(c10::DeviceType::CPU)), nullptr, false);
  auto out = at::detail::make_tensor<c10::TensorImpl>(std::move(st),
                                                      c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                      c10::scalarTypeToTypeMeta(g.dtype));
  out.unsafeGetTensorImpl()->set_sizes_and_strides(g.sizes, g.strides, g.offset);
  return out;
}

const c10::Storage* StorageMap::source_of(const c10::StorageImpl* mapped) const {
  for (const auto& e : map_)
    if (e.mapped.unsafeGetStorageImpl() == mapped) return e.source ? &e.source : nullptr;
  return nullptr;
}

at::Tensor device_empty(const TensorGeom& g, c10::Device device) {
  // The allocator allocates on the current device: make that `device` for callers outside a
  // DeviceGuard (the fusion recorder gave torch.where on neuron:1 a neuron:0 result).
  c10::OptionalDeviceGuard guard;
  if (device.has_index() && device.index() != runtime::device_current()) guard.reset_device(device);
  c10::Allocator* alloc = c10::GetAllocator(c10::DeviceType::PrivateUse1);
  c10::DispatchKeySet ks(c10::DispatchKey::PrivateUse1);
  if (g.offset == 0) {
    return at::detail::empty_strided_generic(g.sizes, g.strides, alloc, ks, g.dtype);
  }
  size_t nbytes =
      at::detail::computeStorageNbytes(g.sizes, g.strides, c10::elementSize(g.dtype), g.offset);
  auto base = at::detail::empty_generic({static_cast<int64_t>(nbytes)}, alloc, ks,
                                        c10::ScalarType::Byte, std::nullopt);
  auto out = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(base.storage()), ks,
                                                      c10::scalarTypeToTypeMeta(g.dtype));
  out.unsafeGetTensorImpl()->set_sizes_and_strides(g.sizes, g.strides, g.offset);
  return out;
}

void device_restride(const at::Tensor& t, const TensorGeom& g) {
  if (same_geom(g, t)) return;
  size_t need =
      at::detail::computeStorageNbytes(g.sizes, g.strides, c10::elementSize(g.dtype), g.offset);
  if (need > t.storage().nbytes() || !t.sizes().equals(g.sizes)) {
    t.resize_(g.sizes);
  }
  if (!same_geom(g, t)) {
    t.unsafeGetTensorImpl()->set_sizes_and_strides(g.sizes, g.strides, g.offset);
  }
}

at::Tensor device_view(const c10::Storage& storage, const TensorGeom& g) {
  auto out = at::detail::make_tensor<c10::TensorImpl>(
      c10::TensorImpl::VIEW, c10::Storage(storage),
      c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), c10::scalarTypeToTypeMeta(g.dtype));
  out.unsafeGetTensorImpl()->set_sizes_and_strides(g.sizes, g.strides, g.offset);
  return out;
}

}  // namespace openneuron::aten
