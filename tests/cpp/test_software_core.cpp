// gtests for the software core's device side: raw memory (alignment, capacity, memory_info),
// asynchronous errors (surfaced at the next sync point, named, cleared) and
// NEURON_LAUNCH_BLOCKING behaviour.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <stdexcept>

#include "runtime/errors.h"
#include "runtime/origin.h"
#include "runtime/software_core.h"
#include "test_util.h"

namespace openneuron::runtime {
namespace {

using testing::Gate;
using testing::make_work;

std::unique_ptr<Hal> make_hal(bool blocking = false, int devices = 1) {
  Config c;
  for (int i = 0; i < devices; ++i) c.visible_cores.push_back(i);
  c.device_memory = uint64_t{64} << 20;
  c.launch_blocking = blocking;
  return software_core_create(c);
}

Work failing(const char* name, uint32_t origin, const char* what) {
  Work w = make_work([what] { throw std::runtime_error(what); }, name);
  w.origin = origin;
  return w;
}

std::string sync_error(Hal& h, HalStream* s) {
  try {
    h.stream_sync(s);
  } catch (const AsyncError& e) {
    return e.what();
  }
  return "";
}

TEST(SoftwareCore, DevicePropsAndCount) {
  auto h = make_hal(false, 3);
  EXPECT_EQ(h->device_count(), 3);
  EXPECT_EQ(h->device_props(2).total_memory, uint64_t{64} << 20);
  EXPECT_FALSE(h->device_props(0).name.empty());
  EXPECT_GE(h->device_props(0).cores, 1);
  EXPECT_TRUE(h->device_props(3).name.empty());
  EXPECT_EQ(h->device_props(-1).total_memory, 0u);
}

TEST(SoftwareCore, MemoryAlignmentAndCapacity) {
  auto h = make_hal();
  uint64_t free = 0, total = 0;
  h->memory_info(0, &free, &total);
  EXPECT_EQ(total, uint64_t{64} << 20);
  EXPECT_EQ(free, total);
  void* small = h->mem_alloc(0, 100);
  void* big = h->mem_alloc(0, uint64_t{8} << 20);
  ASSERT_NE(small, nullptr);
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big) % 4096, 0u);
  h->memory_info(0, &free, &total);
  EXPECT_EQ(free, total - (uint64_t{8} << 20) - 128);
  EXPECT_EQ(h->mem_alloc(0, uint64_t{60} << 20), nullptr);  // past capacity
  h->mem_free(0, big);
  void* again = h->mem_alloc(0, uint64_t{60} << 20);
  EXPECT_NE(again, nullptr);
  h->mem_free(0, again);
  h->mem_free(0, small);
  h->memory_info(0, &free, &total);
  EXPECT_EQ(free, total);
  EXPECT_THROW(h->mem_alloc(5, 10), DeviceError);
}

TEST(SoftwareCore, AsyncErrorSurfacesAtNextSyncWithOriginAndIsCleared) {
  origin_set_resolver(
      [](uint32_t id) { return id == 7 ? std::string("train.py:42 in forward") : std::string(); });
  auto h = make_hal();
  HalStream* s = h->stream_create(0, 0);
  std::atomic<bool> later_ran{false};
  h->stream_enqueue(s, make_work([] {}));
  h->stream_enqueue(s, failing("aten::add.out", 7, "shape mismatch"));
  h->stream_enqueue(s, failing("aten::mul.out", 0, "second failure"));
  h->stream_enqueue(s, make_work([&] { later_ran = true; }));
  EXPECT_EQ(sync_error(*h, s),
            "neuron:0: aten::add.out (op #2, enqueued at train.py:42 in forward) failed "
            "asynchronously: shape mismatch");
  EXPECT_TRUE(later_ran.load());
  EXPECT_EQ(sync_error(*h, s), "");  // cleared
  h->stream_enqueue(s, failing("aten::mul.out", 0, "boom"));
  EXPECT_EQ(sync_error(*h, s), "neuron:0: aten::mul.out (op #5) failed asynchronously: boom");
  origin_set_resolver(nullptr);
  h->stream_destroy(s);
}

TEST(SoftwareCore, AsyncErrorIsPerDeviceAndRaisedByEventSync) {
  auto h = make_hal(false, 2);
  HalStream* s0 = h->stream_create(0, 0);
  HalStream* s1 = h->stream_create(1, 0);
  HalStream* other0 = h->stream_create(0, 0);
  h->stream_enqueue(s0, failing("aten::div.out", 0, "bad"));
  HalEvent* e = h->event_create(kEventDefault);
  h->event_record(e, s0);
  EXPECT_NO_THROW(h->stream_sync(s1));  // device 1 is clean
  EXPECT_THROW(h->event_sync(e), AsyncError);
  EXPECT_NO_THROW(h->stream_sync(other0));
  h->stream_enqueue(s0, failing("aten::div.out", 0, "bad"));
  h->stream_sync(s1);
  while (!h->stream_query(s0)) std::this_thread::yield();
  EXPECT_TRUE(h->stream_query(s0));                  // query never throws
  EXPECT_THROW(h->stream_sync(other0), AsyncError);  // any sync point on the device
  h->event_destroy(e);
  for (HalStream* s : {s0, s1, other0}) h->stream_destroy(s);
}

TEST(SoftwareCore, LaunchBlockingRunsSynchronouslyAndThrowsAtOnce) {
  auto h = make_hal(true);
  HalStream* s = h->stream_create(0, 0);
  bool ran = false;
  h->stream_enqueue(s, make_work([&] { ran = true; }));
  EXPECT_TRUE(ran);
  EXPECT_TRUE(h->stream_query(s));
  try {
    h->stream_enqueue(s, failing("aten::bad", 0, "kaput"));
    ADD_FAILURE() << "expected AsyncError";
  } catch (const AsyncError& e) {
    EXPECT_STREQ(e.what(), "neuron:0: aten::bad (op #2) failed asynchronously: kaput");
  }
  EXPECT_NO_THROW(h->stream_sync(s));
  h->stream_destroy(s);
}

TEST(SoftwareCore, NonStdExceptionIsReported) {
  auto h = make_hal();
  HalStream* s = h->stream_create(0, 0);
  h->stream_enqueue(s, make_work([] { throw 42; }, "custom op"));
  const std::string msg = sync_error(*h, s);
  EXPECT_NE(msg.find("custom op (op #1) failed asynchronously: unknown exception"),
            std::string::npos)
      << msg;
  h->stream_destroy(s);
}

}  // namespace
}  // namespace openneuron::runtime
