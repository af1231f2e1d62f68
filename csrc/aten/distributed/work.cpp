#include "aten/distributed/work.h"

#include <ATen/core/ivalue.h>
#include <c10/core/StreamGuard.h>

#include <algorithm>
#include <mutex>
#include <set>
#include <stdexcept>
#include <utility>

#include "aten/ops/enqueue.h"
#include "aten/streams.h"

namespace openneuron::aten::distributed {

namespace {

// "c10d::<op>": the completion item's name, in static storage (traces and errors keep it).
const char* item_name(const char* op) {
  static std::mutex mu;
  static std::set<std::string>* names = new std::set<std::string>();  // NOTE: a few op names
  std::lock_guard<std::mutex> lock(mu);
  return names->insert(std::string("c10d::") + op).first->c_str();
}

bool all_on(const std::vector<at::Tensor>& ts, c10::DeviceIndex d) {
  return std::all_of(ts.begin(), ts.end(), [&](const at::Tensor& t) {
    return t.device().is_privateuseone() && t.device().index() == d;
  });
}

}  // namespace

// --- Completion -------------------------------------------------------------------------------

void Completion::complete(std::exception_ptr e) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::move(e);
    done_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
}

bool Completion::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return done_.load(std::memory_order_acquire); });
}

std::exception_ptr Completion::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

// --- NeuronWork -------------------------------------------------------------------------------

NeuronWork::NeuronWork(int rank, c10d::OpType type, const char* title,
                       std::vector<at::Tensor> outputs, c10::DeviceIndex device,
                       std::chrono::milliseconds timeout, std::string describe)
    : c10d::Work(rank, type, title),
      outputs_(std::move(outputs)),
      item_name_(item_name(title)),
      device_(device),
      timeout_(timeout),
      describe_(std::move(describe)),
      completion_(std::make_shared<Completion>()) {
  auto list = c10::ListType::create(c10::TensorType::get());
  // NOTE: stream-aware (NCCL's kind) when every output is on this rank's neuron device.
  if (device_ >= 0 && all_on(outputs_, device_)) {
    future_ = c10::make_intrusive<c10::ivalue::Future>(
        list, std::vector<c10::Device>{c10::Device(c10::kPrivateUse1, device_)});
  } else {
    future_ = c10::make_intrusive<c10::ivalue::Future>(list);
  }
}

bool NeuronWork::isCompleted() { return completion_->done(); }

bool NeuronWork::isSuccess() const { return completion_->done() && !completion_->error(); }

std::exception_ptr NeuronWork::exception() const { return completion_->error(); }

std::vector<at::Tensor> NeuronWork::result() { return outputs_; }

c10::intrusive_ptr<c10::ivalue::Future> NeuronWork::getFuture() { return future_; }

std::chrono::milliseconds NeuronWork::bound() const {
  // NOTE: the transport bounds each of its waits by the timeout and names the peer that did
  // not come; this bound only catches a communication thread that never ends.
  return std::max(2 * timeout_, timeout_ + std::chrono::milliseconds(30000));
}

void NeuronWork::enqueue_completion(const runtime::Stream& comm) {
  // NOTE: the item holds the completion only, never tensors (a queued closure is destroyed
  // late, by the thread that next reuses its slot).
  enqueue_op(
      comm, item_name_,
      [c = completion_, bound = bound(), what = describe_] {
        if (!c->wait(bound))
          throw std::runtime_error("neuron collectives: " + what + " did not complete within " +
                                   std::to_string(bound.count()) + " ms");
        if (std::exception_ptr e = c->error(); e && c->claim_report()) std::rethrow_exception(e);
      },
      origin_capture(), false);
  done_event_ = std::make_unique<runtime::Event>();
  done_event_->record(comm);
  if (future_->hasValue() || future_->devices().empty()) return;
  // The future's events are recorded on `comm`, after the completion item.
  c10::StreamGuard guard(to_c10(comm));
  future_->markCompleted(c10::IValue(outputs_));
}

c10::intrusive_ptr<c10::ivalue::Future> NeuronWork::complete_future() {
  if (!future_->devices().empty()) return {};
  // NOTE: runs the future's callbacks (DDP comm hooks on CPU tensors) here, as Gloo does.
  if (std::exception_ptr e = completion_->error()) {
    future_->setError(e);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
  }
  return future_;
}

void NeuronWork::blockCurrentStream() {
  if (!done_event_) {
    synchronize();
    return;
  }
  if (std::exception_ptr e = completion_->error()) {
    if (completion_->claim_report()) std::rethrow_exception(e);
    return;  // the completion item reported it: raised at the next sync
  }
  if (completion_->done()) return;
  // NOTE: the current stream waits for the completion item; the host and the other streams go on.
  done_event_->block(runtime::stream_current(device_));
}

void NeuronWork::synchronize() {
  if (!completion_->wait(bound()))
    TORCH_CHECK(false, "neuron collectives: ", describe_, " did not complete within ",
                bound().count(),
                " ms. Check that every rank calls the same collectives in the same order, or "
                "raise `timeout` in init_process_group / new_group.");
  rethrow_unreported();
}

void NeuronWork::rethrow_unreported() {
  std::exception_ptr e = completion_->error();
  // NOTE: CPU tensors have no completion item: their error is raised at every wait.
  if (e && (!done_event_ || completion_->claim_report())) std::rethrow_exception(e);
}

bool NeuronWork::wait(std::chrono::milliseconds timeout) {
  if (done_event_ && timeout == kNoTimeout) {
    blockCurrentStream();
    return true;
  }
  if (!completion_->wait(timeout == kNoTimeout ? bound() : timeout))
    TORCH_CHECK(false, "neuron collectives: ", describe_, " did not complete within ",
                (timeout == kNoTimeout ? bound() : timeout).count(), " ms");
  rethrow_unreported();
  return true;
}

}  // namespace openneuron::aten::distributed
