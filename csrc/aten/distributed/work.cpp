#include "aten/distributed/work.h"

#include <ATen/core/ivalue.h>

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "aten/ops/enqueue.h"
#include "runtime/stream.h"

namespace openneuron::aten::distributed {

NeuronWork::NeuronWork(int rank, c10d::OpType type, const char* title,
                       std::vector<at::Tensor> outputs, bool on_neuron, c10::DeviceIndex device,
                       std::chrono::milliseconds timeout, std::string describe)
    : c10d::Work(rank, type, title),
      outputs_(std::move(outputs)),
      on_neuron_(on_neuron),
      device_(device),
      timeout_(timeout),
      describe_(std::move(describe)),
      future_(
          c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {
}

bool NeuronWork::isCompleted() { return done_.load(std::memory_order_acquire); }

bool NeuronWork::isSuccess() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_ && !exception_;
}

std::exception_ptr NeuronWork::exception() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return exception_;
}

std::vector<at::Tensor> NeuronWork::result() { return outputs_; }

c10::intrusive_ptr<c10::ivalue::Future> NeuronWork::getFuture() { return future_; }

void NeuronWork::complete(std::exception_ptr e) {
  std::vector<at::Tensor> release = std::move(keep_);
  release.clear();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    completed_ = true;
    exception_ = e;
  }
  done_.store(true, std::memory_order_release);
  cv_.notify_all();
  // NOTE: runs the future's callbacks (DDP comm hooks) here, on the communication thread.
  if (e) {
    future_->setError(e);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
  }
}

std::chrono::milliseconds NeuronWork::bound() const {
  // NOTE: the transport bounds each of its waits by the timeout and names the peer that did
  // not come; this bound only catches a communication thread that never ends.
  return std::max(2 * timeout_, timeout_ + std::chrono::milliseconds(30000));
}

bool NeuronWork::wait_host(std::chrono::milliseconds timeout) {
  if (timeout <= std::chrono::milliseconds::zero()) timeout = bound();
  std::unique_lock<std::mutex> lock(mutex_);
  return cv_.wait_for(lock, timeout, [&] { return completed_; });
}

void NeuronWork::blockCurrentStream() {
  if (!on_neuron_) {
    synchronize();
    return;
  }
  if (std::exception_ptr e = exception()) std::rethrow_exception(e);
  if (isCompleted()) return;
  // NOTE: the stream's executor waits; the host and the other streams go on.
  enqueue_op(runtime::stream_current(device_), "c10d::wait",
             [self = c10::intrusive_ptr<NeuronWork>::unsafe_reclaim_from_nonowning(this)] {
               if (!self->wait_host(std::chrono::milliseconds::zero()))
                 throw std::runtime_error("neuron collectives: " + self->describe_ +
                                          " did not complete within " +
                                          std::to_string(self->bound().count()) + " ms");
               if (std::exception_ptr e = self->exception()) std::rethrow_exception(e);
             });
}

void NeuronWork::synchronize() {
  if (!wait_host(std::chrono::milliseconds::zero()))
    TORCH_CHECK(false, "neuron collectives: ", describe_, " did not complete within ",
                bound().count(),
                " ms. Check that every rank calls the same collectives in the same order, or "
                "raise `timeout` in init_process_group / new_group.");
  if (std::exception_ptr e = exception()) std::rethrow_exception(e);
}

bool NeuronWork::wait(std::chrono::milliseconds timeout) {
  if (on_neuron_ && timeout == kNoTimeout) {
    blockCurrentStream();
    return true;
  }
  if (!wait_host(timeout == kNoTimeout ? std::chrono::milliseconds::zero() : timeout))
    TORCH_CHECK(false, "neuron collectives: ", describe_, " did not complete within ",
                (timeout == kNoTimeout ? timeout_ : timeout).count(), " ms");
  if (std::exception_ptr e = exception()) std::rethrow_exception(e);
  return true;
}

}  // namespace openneuron::aten::distributed
