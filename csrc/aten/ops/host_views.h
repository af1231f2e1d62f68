// Zero-copy re-typings of neuron tensors used by the fallback: CPU tensors over the device
// buffers (what ATen's CPU kernels run on inside a work item) and meta tensors with the same
// geometry (what meta kernels size outputs from). Tensors that share a device storage share one
// re-typed storage, so kernels still see their aliasing. Not an allocator: nothing is copied.
// NOTE: work items hold DeviceBuffers, not storages: as on CUDA, a tensor freed while queued
// work still uses it goes back to its stream's pool at once, and stream order keeps the reuse
// after that work (caching_allocator.h).
#pragma once

#include <ATen/ATen.h>
#include <c10/util/SmallVector.h>

#include <utility>

namespace openneuron::aten {

// Geometry of one tensor: enough to rebuild it over another storage.
struct TensorGeom {
  c10::SmallVector<int64_t, 5> sizes;
  c10::SmallVector<int64_t, 5> strides;
  int64_t offset = 0;
  c10::ScalarType dtype = c10::ScalarType::Float;
  bool defined = false;
  bool conj = false;
  bool neg = false;
};

// The memory of a device storage, without owning it.
struct DeviceBuffer {
  void* data = nullptr;
  size_t nbytes = 0;
};

TensorGeom geom_of(const at::Tensor& t);
DeviceBuffer buffer_of(const at::Tensor& t);
bool same_geom(const TensorGeom& g, const at::Tensor& t);

class StorageMap {
 public:
  // keep_sources: hold the device storages of tensors passed to view_of(Tensor) (synchronous
  // users that map results back with source_of); work items must not (see the NOTE above).
  StorageMap(c10::DeviceType target, bool keep_sources)
      : target_(target), keep_sources_(keep_sources) {}
  // A tensor of the target device type over t's storage, same sizes/strides/offset/dtype.
  at::Tensor view_of(const at::Tensor& t);
  // The same for a device buffer and a geometry captured earlier.
  at::Tensor view_of(const DeviceBuffer& buffer, const TensorGeom& g);
  // The device storage a re-typed storage stands for; nullptr if `mapped` is none of ours or
  // the map does not keep sources.
  const c10::Storage* source_of(const c10::StorageImpl* mapped) const;

 private:
  at::Tensor view_of(const DeviceBuffer& buffer, const TensorGeom& g, const c10::Storage* src);
  struct Entry {
    const void* key = nullptr;
    c10::Storage source;  // empty unless keep_sources_
    c10::Storage mapped;
  };
  c10::DeviceType target_;
  bool keep_sources_;
  c10::SmallVector<Entry, 8> map_;
};

// A CPU view of a device buffer with g's geometry, over a storage of its own.
at::Tensor host_view_fresh(const DeviceBuffer& buffer, const TensorGeom& g);

// A new neuron tensor on `device` with g's geometry (allocated on the current stream).
at::Tensor device_empty(const TensorGeom& g, c10::Device device);
// Gives the device tensor t g's geometry (in-place/out= args whose shape the op changed).
void device_restride(const at::Tensor& t, const TensorGeom& g);
// A device view of a device storage with g's geometry (a view op's result).
at::Tensor device_view(const c10::Storage& storage, const TensorGeom& g);

}  // namespace openneuron::aten
