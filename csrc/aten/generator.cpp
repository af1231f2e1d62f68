// The neuron random generator (generator.h): a Philox-style (seed, offset) state per device,
// default generators created on first use, and the _get_default_generator binding. Random
// kernels (ops/) take philox_state() under the generator's mutex; they live elsewhere.
#include "aten/generator.h"

#include <ATen/Utils.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <c10/core/GeneratorImpl.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/Generator.h>

#include <cstring>
#include <deque>
#include <mutex>

#include "aten/bindings.h"
#include "aten/errors.h"
#include "aten/streams.h"
#include "runtime/device.h"

namespace openneuron::aten {

namespace {
constexpr size_t kStateBytes = 16;  // seed (uint64) + offset (int64)
}

NeuronGenerator::NeuronGenerator(c10::DeviceIndex device, uint64_t seed)
    : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, device),
                         c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      seed_(seed) {}

void NeuronGenerator::set_current_seed(uint64_t seed) {
  seed_ = seed;
  offset_ = 0;
}

uint64_t NeuronGenerator::current_seed() const { return seed_; }

uint64_t NeuronGenerator::seed() {
  uint64_t s = c10::detail::getNonDeterministicRandom(true);
  set_current_seed(s);
  return s;
}

void NeuronGenerator::set_offset(uint64_t offset) {
  TORCH_CHECK(offset % 4 == 0, "neuron generator offset must be a multiple of 4, got ", offset);
  offset_ = offset;
}

uint64_t NeuronGenerator::get_offset() const { return offset_; }

void NeuronGenerator::set_state(const c10::TensorImpl& new_state) {
  at::detail::check_rng_state(new_state);
  TORCH_CHECK(new_state.numel() == static_cast<int64_t>(kStateBytes),
              "neuron RNG state must be a ByteTensor of ", kStateBytes,
              " bytes (seed, offset), got ", new_state.numel(),
              " bytes; use torch.neuron.get_rng_state() to obtain one.");
  const auto* bytes = static_cast<const uint8_t*>(new_state.data());
  uint64_t seed = 0;
  int64_t offset = 0;
  std::memcpy(&seed, bytes, sizeof(seed));
  std::memcpy(&offset, bytes + sizeof(seed), sizeof(offset));
  TORCH_CHECK(offset >= 0, "neuron RNG state has a negative offset ", offset);
  seed_ = seed;
  offset_ = static_cast<uint64_t>(offset);
}

c10::intrusive_ptr<c10::TensorImpl> NeuronGenerator::get_state() const {
  auto state = at::detail::empty_cpu({static_cast<int64_t>(kStateBytes)}, c10::ScalarType::Byte,
                                     std::nullopt, std::nullopt, std::nullopt, std::nullopt);
  auto* bytes = state.data_ptr<uint8_t>();
  const int64_t offset = static_cast<int64_t>(offset_);
  std::memcpy(bytes, &seed_, sizeof(seed_));
  std::memcpy(bytes + sizeof(seed_), &offset, sizeof(offset));
  return state.getIntrusivePtr();
}

PhiloxState NeuronGenerator::philox_state(uint64_t increment) {
  increment = philox_increment(increment);
  PhiloxState state{seed_, offset_};
  offset_ += increment;
  return state;
}

NeuronGenerator* NeuronGenerator::clone_impl() const {
  auto* gen = new NeuronGenerator(device().index(), seed_);
  gen->offset_ = offset_;
  return gen;
}

const at::Generator& default_generator(c10::DeviceIndex d) {
  // NOTE: a deque never moves its elements, so references handed out stay valid while later
  // devices are added.
  static std::mutex mutex;
  static std::deque<std::unique_ptr<at::Generator>> generators;
  d = with_torch_errors([&] {
    c10::DeviceIndex idx = resolve_device(d);
    runtime::device_check(idx);
    return idx;
  });
  std::lock_guard<std::mutex> lock(mutex);
  while (generators.size() <= static_cast<size_t>(d)) generators.emplace_back();
  auto& slot = generators[d];
  if (!slot) {
    slot = std::make_unique<at::Generator>(at::make_generator<NeuronGenerator>(d));
  }
  return *slot;
}

NeuronGenerator* generator_or_default(const std::optional<at::Generator>& gen, c10::DeviceIndex d) {
  return at::get_generator_or_default<NeuronGenerator>(gen, default_generator(d));
}

void bind_random(pybind11::module_& m) {
  m.def(
      "_get_default_generator",
      [](int device) {
        return pybind11::reinterpret_steal<pybind11::object>(
            THPGenerator_initDefaultGenerator(default_generator(device)));
      },
      pybind11::arg("device") = -1, "The default torch.Generator of neuron:device.");
}

}  // namespace openneuron::aten
