// Zero-copy re-typings of neuron tensors used by the fallback: CPU tensors over the device
// buffers (what ATen's CPU kernels run on inside a work item) and meta tensors with the same
// geometry (what meta kernels size outputs from). Tensors that share a device storage share one
// re-typed storage, so kernels still see their aliasing. Not an allocator: nothing is copied.
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

TensorGeom geom_of(const at::Tensor& t);
bool same_geom(const TensorGeom& g, const at::Tensor& t);

class StorageMap {
 public:
  explicit StorageMap(c10::DeviceType target) : target_(target) {}
  // A tensor of the target device type over t's storage, same sizes/strides/offset/dtype.
  at::Tensor view_of(const at::Tensor& t);
  // The same for a storage and a geometry captured earlier.
  at::Tensor view_of(const c10::Storage& storage, const TensorGeom& g);
  // The device storage a re-typed storage stands for; nullptr if `mapped` is none of ours.
  const c10::Storage* source_of(const c10::StorageImpl* mapped) const;

 private:
  struct Entry {
    c10::Storage source;
    c10::Storage mapped;
  };
  c10::DeviceType target_;
  c10::SmallVector<Entry, 8> map_;
};

// A CPU view of a device storage with g's geometry, over a storage of its own.
at::Tensor host_view_fresh(const c10::Storage& storage, const TensorGeom& g);

// A new neuron tensor on `device` with g's geometry (allocated on the current stream).
at::Tensor device_empty(const TensorGeom& g, c10::Device device);
// Gives the device tensor t g's geometry (in-place/out= args whose shape the op changed).
void device_restride(const at::Tensor& t, const TensorGeom& g);
// A device view of a device storage with g's geometry (a view op's result).
at::Tensor device_view(const c10::Storage& storage, const TensorGeom& g);

}  // namespace openneuron::aten
