// Native neuron factories and storage-metadata ops: empty.memory_format, empty_strided,
// resize_, the set_ overloads and record_stream. Memory comes from the neuron allocator on the
// current stream; growing a storage is stream-ordered (allocator.cpp). Views are views.cpp,
// copies copy.cpp, everything else the ops helper's files.
#include <ATen/EmptyTensor.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/set_native.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "aten/allocator.h"

namespace openneuron::aten {
namespace {

constexpr c10::DispatchKeySet kNeuronKeys(c10::DispatchKey::PrivateUse1);

void check_factory_args(const char* op, c10::Device device, std::optional<c10::Layout> layout,
                        std::optional<bool> pin_memory) {
  TORCH_CHECK(device.is_privateuseone(), op, ": expected a neuron device, got ", device);
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided, op,
              ": only strided tensors are supported on neuron, got layout ",
              c10::layout_or_default(layout));
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), op,
              ": pin_memory applies to CPU tensors only; create the tensor on CPU with "
              "pin_memory=True instead.");
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory,
                               std::optional<c10::MemoryFormat> memory_format) {
  const c10::Device d = c10::device_or_default(device);
  check_factory_args("empty", d, layout, pin_memory);
  const c10::DeviceGuard guard(d);
  return at::detail::empty_generic(size, device_allocator(), kNeuronKeys,
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                         std::optional<c10::Device> device, std::optional<bool> pin_memory) {
  const c10::Device d = c10::device_or_default(device);
  check_factory_args("empty_strided", d, layout, pin_memory);
  const c10::DeviceGuard guard(d);
  return at::detail::empty_strided_generic(size, stride, device_allocator(), kNeuronKeys,
                                           c10::dtype_or_default(dtype));
}

// Sets sizes (and strides) and grows the storage if the new geometry needs more bytes.
void resize_impl(c10::TensorImpl* self, c10::IntArrayRef size, at::OptionalIntArrayRef stride) {
  if (self->sizes() == size && (!stride || self->strides() == *stride)) return;
  const size_t itemsize = self->dtype().itemsize();
  const size_t offset = static_cast<size_t>(self->storage_offset());
  size_t nbytes = 0;
  if (stride) {
    self->set_sizes_and_strides(size, *stride);
    nbytes = at::detail::computeStorageNbytes(size, *stride, itemsize, offset);
  } else {
    self->set_sizes_contiguous(size);
    nbytes = at::detail::computeStorageNbytesContiguous(size, itemsize, offset);
  }
  if (self->numel() == 0) return;
  const c10::Storage& storage = self->unsafe_storage();
  TORCH_CHECK(storage, "resize_: neuron tensor has no storage");
  if (nbytes > storage.nbytes()) storage_resize_bytes(storage, nbytes);
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format) {
  const c10::DeviceGuard guard(self.device());
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  resize_impl(impl, size, std::nullopt);
  if (memory_format) {
    TORCH_CHECK(*memory_format != c10::MemoryFormat::Preserve,
                "resize_: unsupported memory format ", *memory_format);
    impl->empty_tensor_restride(*memory_format);
  }
  return self;
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source, int64_t storage_offset,
                        c10::IntArrayRef size, c10::IntArrayRef stride) {
  at::native::checkSetStorage(self, std::move(source), storage_offset, size, stride);
  const c10::DeviceGuard guard(self.device());
  self.unsafeGetTensorImpl()->set_storage_offset(storage_offset);
  at::OptionalIntArrayRef stride_opt =
      stride.data() != nullptr ? at::OptionalIntArrayRef(stride) : std::nullopt;
  resize_impl(self.unsafeGetTensorImpl(), size, stride_opt);
  return self;
}

at::Tensor& set_empty(at::Tensor& self) {
  const c10::DeviceGuard guard(self.device());
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, device_allocator(), true);
  return set_storage(self, std::move(storage), 0, {0}, {});
}

at::Tensor& set_source_storage(at::Tensor& self, c10::Storage source) {
  return at::native::set_(self, std::move(source));
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  return at::native::set_tensor_(self, source);
}

void record_stream(at::Tensor& self, c10::Stream stream) {
  TORCH_CHECK(stream.device_type() == c10::DeviceType::PrivateUse1,
              "record_stream: a neuron tensor needs a neuron stream, got one on ", stream.device());
  allocator_record_data_ptr(self.storage().data_ptr(), stream);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", TORCH_FN(empty_memory_format));
  m.impl("empty_strided", TORCH_FN(empty_strided));
  m.impl("resize_", TORCH_FN(resize_));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(set_storage));
  m.impl("set_.source_Storage", TORCH_FN(set_source_storage));
  m.impl("set_.source_Tensor", TORCH_FN(set_source_tensor));
  m.impl("set_", TORCH_FN(set_empty));
  m.impl("record_stream", TORCH_FN(record_stream));
}

}  // namespace openneuron::aten
