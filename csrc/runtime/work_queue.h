// The software NeuronCore's stream engine: a bounded, in-order queue of Work items run by one
// executor thread (started on the first push). Private to csrc/runtime; software_core.cpp
// builds HalStream, events and error reporting on top. Not a general thread pool.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "hal.h"
#include "trace.h"

namespace openneuron::runtime {

// Receives the failure of a Work item on the executor thread.
class ErrorSink {
 public:
  virtual ~ErrorSink() = default;
  virtual void on_error(const Work& work, const char* what) noexcept = 0;
};

// Spins on the CPU for a few nanoseconds (pause), letting a sibling hyperthread run.
void cpu_relax() noexcept;
// One step of a polite spin-wait: busy for the first iterations, then yielding the core (the
// host is often oversubscribed: executors, the Python thread and intra-op workers share it).
// Returns false once `deadline` has passed: time to sleep.
bool spin_step(unsigned iteration, std::chrono::steady_clock::time_point deadline) noexcept;

class WorkQueue {
 public:
  // name: the executor thread's name (at most 15 characters shown), e.g. "neuron0:s3".
  WorkQueue(ErrorSink* sink, std::string name);
  // Calls shutdown().
  ~WorkQueue();
  // Waits for every pushed item, then stops and joins the executor thread; no pushes after it.
  // Idempotent. done() stays valid, so events may still refer to a shut-down queue.
  void shutdown();
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // Appends work; blocks while kMaxQueuedWork items are pending (throws Error if the caller
  // is this queue's executor, which would wait for itself). Returns the item's ticket: the
  // item has run once done() >= ticket. thread-safe (producers are serialized).
  uint64_t push(Work&& work);
  // Blocks until done() >= ticket. Throws Error instead of deadlocking when called from this
  // queue's own executor for work not yet done (a work item syncing its own stream).
  void wait(uint64_t ticket) const;
  uint64_t pushed() const { return tail_.load(std::memory_order_acquire); }
  uint64_t done() const { return head_.load(std::memory_order_acquire); }

 private:
  static constexpr uint64_t kCapacity = kMaxQueuedWork;
  static_assert((kCapacity & (kCapacity - 1)) == 0, "queue capacity must be a power of two");

  void run();
  uint64_t await_work(uint64_t head);
  void execute(Work& work) noexcept;
  // execute() while a profiler session is active: times the item into the trace (trace.h).
  void execute_traced(Work& work, const trace::Launch& launch) noexcept;

  ErrorSink* sink_;
  const std::string name_;
  std::unique_ptr<Work[]> slots_;
  // Profiler: who pushed each slot and when (noted only while tracing; the ticket tells a
  // fresh note from a stale one), and where this queue's trace records go.
  std::unique_ptr<trace::Launch[]> launches_;
  const trace::QueueId trace_id_;

  // Producer side (guarded by push_mu_, except tail_ which the executor reads).
  std::mutex push_mu_;
  bool started_ = false;
  bool shut_down_ = false;
  uint64_t cached_head_ = 0;
  std::thread thread_;
  alignas(64) std::atomic<uint64_t> tail_{0};  // items pushed

  // Executor side.
  alignas(64) std::atomic<uint64_t> head_{0};  // items completed
  // NOTE: producer and executor publish tail_/sleeping_ (and head_/wake_at_) with seq_cst
  // stores followed by a seq_cst load of the other flag, so either the sleeper sees the new
  // value or the publisher sees the sleeper and notifies under mu_: no lost wake-ups, and no
  // futex call while the executor is spinning or before a sleeping waiter's ticket is done.
  static constexpr uint64_t kNoWaiter = ~uint64_t{0};
  alignas(64) std::atomic<bool> sleeping_{false};
  mutable std::atomic<uint64_t> wake_at_{kNoWaiter};  // smallest ticket a sleeper waits for
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  std::condition_variable work_cv_;
  mutable std::condition_variable done_cv_;
};

}  // namespace openneuron::runtime
