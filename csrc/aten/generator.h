// The neuron random generator: Philox-style state (seed, offset), one default per device, as
// CUDA's. Random ops take (seed, offset) at dispatch and advance the offset, so results depend
// only on the state (get/set_rng_state, DTensor's RNG tracker and checkpointing rely on it).
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>

#include <cstdint>
#include <optional>

namespace openneuron::aten {

struct PhiloxState {
  uint64_t seed = 0;
  uint64_t offset = 0;
};

class NeuronGenerator : public c10::GeneratorImpl {
 public:
  explicit NeuronGenerator(c10::DeviceIndex device, uint64_t seed = c10::default_rng_seed_val);

  void set_current_seed(uint64_t seed) override;  // also resets the offset to 0
  uint64_t current_seed() const override;
  uint64_t seed() override;  // a non-deterministic seed, set and returned
  void set_offset(uint64_t offset) override;
  uint64_t get_offset() const override;
  // 16 bytes: seed (uint64) then offset (int64), as CUDA's Philox state.
  void set_state(const c10::TensorImpl& new_state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;
  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }

  // The state for one random op, advancing the offset by `increment` (rounded up to 4, as
  // Philox draws 4 values per counter: philox_increment). Callers hold mutex_.
  PhiloxState philox_state(uint64_t increment);
  static uint64_t philox_increment(uint64_t increment) { return (increment + 3) / 4 * 4; }

 private:
  NeuronGenerator* clone_impl() const override;
  uint64_t seed_;
  uint64_t offset_ = 0;
};

// The default generator of device d (created on first use).
const at::Generator& default_generator(c10::DeviceIndex d);
// gen if given (checked to be a neuron generator), else device d's default.
NeuronGenerator* generator_or_default(const std::optional<at::Generator>& gen, c10::DeviceIndex d);

}  // namespace openneuron::aten
