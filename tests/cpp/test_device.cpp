// gtests for device.cpp over the process HAL (configured by test_environment.cpp: 2 devices):
// count, index checks and their message, the thread's current device, device-wide sync.
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>

#include "runtime/device.h"
#include "runtime/errors.h"
#include "runtime/stream.h"
#include "test_util.h"

namespace openneuron::runtime {
namespace {

using testing::Gate;
using testing::make_work;

TEST(Device, CountAndProps) {
  EXPECT_EQ(device_count(), 2);
  EXPECT_EQ(device_props(1).total_memory, uint64_t{1} << 30);
  EXPECT_EQ(device_props(0).name, "NeuronCore-v3 (software)");
}

TEST(Device, InvalidIndexMessage) {
  try {
    device_check(7);
    ADD_FAILURE() << "expected DeviceError";
  } catch (const DeviceError& e) {
    EXPECT_STREQ(e.what(),
                 "invalid device index 7: neuron has 2 devices (neuron:0..neuron:1); check the "
                 "index or NEURON_RT_VISIBLE_CORES");
  }
  EXPECT_THROW(device_check(-1), DeviceError);
  EXPECT_THROW(device_props(2), DeviceError);
  EXPECT_THROW(device_set_current(2), DeviceError);
  EXPECT_NO_THROW(device_check(1));
}

TEST(Device, CurrentDeviceIsPerThread) {
  EXPECT_EQ(device_current(), 0);
  device_set_current(1);
  EXPECT_EQ(device_current(), 1);
  std::thread([] { EXPECT_EQ(device_current(), 0); }).join();
  device_set_current(0);
}

TEST(Device, SynchronizeWaitsForEveryStreamAndRaisesPendingError) {
  const Stream a = stream_from_pool(1);
  const Stream b = stream_from_pool(1, kStreamPriorityHigh);
  std::atomic<int> ran{0};
  Gate gate;
  a.enqueue(gate.work());
  a.enqueue(make_work([&] { ran.fetch_add(1); }));
  b.enqueue(make_work([] { throw std::runtime_error("boom"); }, "aten::bad"));
  stream_default(1).enqueue(make_work([&] { ran.fetch_add(1); }));
  gate.open();
  EXPECT_THROW(device_synchronize(1), AsyncError);
  EXPECT_EQ(ran.load(), 2);
  EXPECT_TRUE(a.query());
  EXPECT_NO_THROW(device_synchronize(1));
  EXPECT_THROW(device_synchronize(2), DeviceError);
}

}  // namespace
}  // namespace openneuron::runtime
