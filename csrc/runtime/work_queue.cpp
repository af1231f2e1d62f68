// The executor behind each software stream: a ring of kMaxQueuedWork slots, one producer at a
// time (push_mu_), one executor thread. The executor spins briefly before sleeping so that a
// steady stream of small ops costs no futex wake per item. Also holds the thread-init hook.
#include "work_queue.h"

#include <pthread.h>

#include <chrono>
#include <exception>
#include <functional>
#include <utility>

#include "errors.h"
#include "parallel.h"
#include "software_core.h"

namespace openneuron::runtime {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kExecutorSpin = std::chrono::microseconds(40);
constexpr auto kWaiterSpin = std::chrono::microseconds(20);
// An executor asleep this long frees its parallel pool (parallel.h says why).
constexpr auto kExecutorIdleRelease = std::chrono::milliseconds(50);
constexpr unsigned kBusySpins = 256;

// NOTE: heap objects reached through function-local statics, never destroyed: executor threads
// of the process-wide HAL may outlive static destruction at exit.
std::mutex& hook_mutex() {
  static auto* m = new std::mutex;
  return *m;
}
std::function<void()>& hook() {
  static auto* f = new std::function<void()>;
  return *f;
}

// The queue whose executor is the calling thread, if any.
thread_local const WorkQueue* tl_running_queue = nullptr;

}  // namespace

bool spin_step(unsigned i, std::chrono::steady_clock::time_point deadline) noexcept {
  if (i < kBusySpins) {
    cpu_relax();
    return true;
  }
  if ((i & 7) == 0 && Clock::now() > deadline) return false;
  std::this_thread::yield();
  return true;
}

void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#else
  std::this_thread::yield();
#endif
}

void executor_set_thread_init(std::function<void()> fn) {
  std::lock_guard<std::mutex> lk(hook_mutex());
  hook() = std::move(fn);
}

WorkQueue::WorkQueue(ErrorSink* sink, std::string name)
    : sink_(sink),
      name_(std::move(name)),
      slots_(new Work[kCapacity]),
      launches_(new trace::Launch[kCapacity]),
      trace_id_(trace::queue_id(name_)) {}

WorkQueue::~WorkQueue() { shutdown(); }

void WorkQueue::shutdown() {
  std::lock_guard<std::mutex> push_lock(push_mu_);
  if (shut_down_) return;
  shut_down_ = true;
  wait(pushed());
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_.store(true, std::memory_order_seq_cst);
  }
  work_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

uint64_t WorkQueue::push(Work&& work) {
  std::lock_guard<std::mutex> lk(push_mu_);
  if (shut_down_) throw Error("work enqueued on a stream that was already destroyed");
  if (!started_) {
    started_ = true;
    thread_ = std::thread([this] { run(); });
  }
  const uint64_t t = tail_.load(std::memory_order_relaxed);
  if (t - cached_head_ >= kCapacity) {
    cached_head_ = head_.load(std::memory_order_acquire);
    if (t - cached_head_ >= kCapacity) {
      // NOTE: wait for a quarter of the queue to drain, not one slot: one wake-up per batch.
      wait(t - kCapacity + kCapacity / 4);
      cached_head_ = head_.load(std::memory_order_acquire);
    }
  }
  slots_[t & (kCapacity - 1)] = std::move(work);
  if (trace::enabled()) {
    trace::Launch& launch = launches_[t & (kCapacity - 1)];
    launch = trace::launch_now();
    launch.ticket = t + 1;
  }
  tail_.store(t + 1, std::memory_order_seq_cst);
  // NOTE: the first producer to see the executor asleep clears the flag and wakes it; later
  // pushes during its wake-up cost no system call.
  if (sleeping_.load(std::memory_order_seq_cst) &&
      sleeping_.exchange(false, std::memory_order_seq_cst)) {
    std::lock_guard<std::mutex> g(mu_);
    work_cv_.notify_one();
  }
  return t + 1;
}

void WorkQueue::wait(uint64_t ticket) const {
  if (head_.load(std::memory_order_acquire) >= ticket) return;
  if (tl_running_queue == this) {
    throw Error(
        "work running on a neuron stream waited for that same stream (synchronize, or enqueue "
        "into its full queue); it would wait for itself forever");
  }
  const auto deadline = Clock::now() + kWaiterSpin;
  for (unsigned i = 1; head_.load(std::memory_order_acquire) < ticket; ++i) {
    if (!spin_step(i, deadline)) break;
  }
  if (head_.load(std::memory_order_acquire) >= ticket) return;
  // NOTE: a host thread (never an executor: tl_running_queue is null here) about to sleep
  // frees its OpenMP pool, left by CPU work it did before: see parallel.h.
  static thread_local Clock::duration tl_last_block{};
  if (tl_running_queue == nullptr) {
    parallel_release_calling_thread(kReleaseOnHostWait);
    if (tl_last_block > std::chrono::nanoseconds(kLongHostBlockNs))
      parallel_release_calling_thread(kReleaseOnLongHostWait);
  }
  const auto blocked_at = Clock::now();
  std::unique_lock<std::mutex> lk(mu_);
  done_cv_.wait(lk, [&] {
    if (ticket < wake_at_.load(std::memory_order_relaxed)) {
      wake_at_.store(ticket, std::memory_order_seq_cst);
    }
    return head_.load(std::memory_order_seq_cst) >= ticket;
  });
  tl_last_block = Clock::now() - blocked_at;
}

void WorkQueue::run() {
  pthread_setname_np(pthread_self(), name_.substr(0, 15).c_str());
  tl_running_queue = this;
  {
    std::function<void()> init;
    {
      std::lock_guard<std::mutex> lk(hook_mutex());
      init = hook();
    }
    if (init) init();
  }
  uint64_t h = head_.load(std::memory_order_relaxed);
  for (;;) {
    uint64_t t = tail_.load(std::memory_order_acquire);
    if (t == h) {
      t = await_work(h);
      if (t == h) return;
    }
    for (; h != t; ++h) {
      Work& w = slots_[h & (kCapacity - 1)];
      if (trace::enabled()) {
        const trace::Launch& launch = launches_[h & (kCapacity - 1)];
        execute_traced(w, launch.ticket == h + 1 ? launch : trace::Launch{});
      } else {
        execute(w);
      }
      // NOTE: the callable is not destroyed here but by the producer that next reuses the
      // slot (push): what a closure holds was allocated on the producer's thread, and freeing
      // it here contended on the malloc arena's lock with every op. Hence Work's contract
      // (hal.h): closures own no device memory and nothing a sync point must see released.
      head_.store(h + 1, std::memory_order_seq_cst);
      if (wake_at_.load(std::memory_order_seq_cst) <= h + 1) {
        {
          std::lock_guard<std::mutex> g(mu_);
          wake_at_.store(kNoWaiter, std::memory_order_relaxed);
        }
        done_cv_.notify_all();
      }
    }
  }
}

uint64_t WorkQueue::await_work(uint64_t h) {
  const auto deadline = Clock::now() + kExecutorSpin;
  for (unsigned i = 1;; ++i) {
    const uint64_t t = tail_.load(std::memory_order_acquire);
    if (t != h) return t;
    if (stop_.load(std::memory_order_acquire)) return t;
    if (!spin_step(i, deadline)) break;
  }
  {
    std::unique_lock<std::mutex> lk(mu_);
    // NOTE: the flag is set again before every wait, not once: a producer that cleared it for
    // an earlier sleep may notify late (after this thread already woke, ran the work and went
    // back to sleep); that wake-up finds no work, and without re-setting the flag the next push
    // would see it cleared and never notify.
    auto ready = [&] {
      if (tail_.load(std::memory_order_seq_cst) != h || stop_.load(std::memory_order_seq_cst)) {
        return true;
      }
      sleeping_.store(true, std::memory_order_seq_cst);
      return tail_.load(std::memory_order_seq_cst) != h || stop_.load(std::memory_order_seq_cst);
    };
    if (!work_cv_.wait_for(lk, kExecutorIdleRelease, ready)) {
      lk.unlock();
      parallel_release_calling_thread(kReleaseOnIdleExecutor);
      lk.lock();
      work_cv_.wait(lk, ready);
    }
  }
  sleeping_.store(false, std::memory_order_relaxed);
  return tail_.load(std::memory_order_acquire);
}

void WorkQueue::execute(Work& w) noexcept {
  try {
    w.fn();
  } catch (const std::exception& e) {
    sink_->on_error(w, e.what());
  } catch (...) {
    sink_->on_error(w, "unknown exception (not derived from std::exception)");
  }
}

void WorkQueue::execute_traced(Work& w, const trace::Launch& launch) noexcept {
  trace::Record r;
  r.name = w.name;
  r.correlation = launch.correlation;
  if (launch.correlation != 0) {
    r.enqueue_ns = launch.enqueue_ns;
    r.host_thread = launch.host_thread;
  }
  r.seq = w.seq;
  r.device = trace_id_.device;
  r.stream = trace_id_.stream;
  r.start_ns = trace::now_ns();
  execute(w);
  r.end_ns = trace::now_ns();
  trace::record(r);
}

}  // namespace openneuron::runtime
