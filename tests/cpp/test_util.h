// Shared helpers for the runtime gtests: a Gate work item that holds a stream until opened, so
// tests can observe "not yet run" states without timing assumptions.
#pragma once

#include <atomic>
#include <memory>
#include <thread>

#include "runtime/hal.h"

namespace openneuron::runtime::testing {

class Gate {
 public:
  Gate() : open_(std::make_shared<std::atomic<bool>>(false)) {}
  // A work item that blocks its stream until open() is called.
  Work work() const {
    Work w;
    auto flag = open_;
    w.fn = [flag] {
      while (!flag->load(std::memory_order_acquire)) std::this_thread::yield();
    };
    w.name = "test gate";
    return w;
  }
  void open() { open_->store(true, std::memory_order_release); }

 private:
  std::shared_ptr<std::atomic<bool>> open_;
};

inline Work make_work(std::function<void()> fn, const char* name = "test work") {
  Work w;
  w.fn = std::move(fn);
  w.name = name;
  return w;
}

}  // namespace openneuron::runtime::testing
