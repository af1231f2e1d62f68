// The c10d Work of the "neuron" process-group backend (DESIGN §7). Ordering as NCCL's: for
// neuron tensors the collective's completion is a work item on the group's communication
// stream, wait() makes the caller's current stream wait for it (no host sync), and the future
// is stream-aware (completed at issue; its callbacks run on the thread that adds them, with the
// streams synchronized). For CPU tensors wait() blocks the host and the future completes on the
// communication thread, as Gloo's.
// NOTE: the communication thread never drops a tensor reference: a tensor's last reference may
// hold a Python object, and taking the GIL there can deadlock with a Python thread that waits
// for a full stream queue. It hands what it held to the backend (NeuronBackend::bury).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

#include "runtime/event.h"
#include "runtime/stream.h"

namespace openneuron::aten::distributed {

// A collective's completion, shared by the Work, the communication thread and the stream item
// (which must not hold tensors). Thread-safe.
class Completion {
 public:
  void complete(std::exception_ptr e);
  // Blocks until complete or `timeout`; false = timed out.
  bool wait(std::chrono::milliseconds timeout);
  bool done() const { return done_.load(std::memory_order_acquire); }
  std::exception_ptr error() const;
  // An error is reported once: by Work.wait() (raised at the call) or by the stream item
  // (raised at the next sync), whichever claims it first.
  bool claim_report() { return !reported_.exchange(true, std::memory_order_acq_rel); }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> done_{false};
  std::atomic<bool> reported_{false};
  std::exception_ptr error_;
};

class NeuronWork : public c10d::Work {
 public:
  // outputs: what result() and the future return. device: the neuron device of the tensors, or
  // -1 for CPU tensors. describe: "all_reduce on group 'x' (rank r of n)", for messages.
  NeuronWork(int rank, c10d::OpType type, const char* title, std::vector<at::Tensor> outputs,
             c10::DeviceIndex device, std::chrono::milliseconds timeout, std::string describe);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override;
  void synchronize() override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void blockCurrentStream() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

  const std::shared_ptr<Completion>& completion() const { return completion_; }
  // Neuron tensors, on the issuing thread right after the collective is posted: the item that
  // waits for it on the group's communication stream `comm`, the event after it, and the
  // future's completion (recorded on `comm`).
  void enqueue_completion(const runtime::Stream& comm);
  // CPU tensors, on the communication thread: completes the future (runs its callbacks).
  // Returns the future reference for the backend to drop elsewhere.
  c10::intrusive_ptr<c10::ivalue::Future> complete_future();
  // How long a wait with no timeout of its own may take: 2x the group's timeout, at least 30 s
  // more (the transport's own timeout error, naming the peer, comes first).
  std::chrono::milliseconds bound() const;

 private:
  // Raises the collective's error unless the completion item already reported it.
  void rethrow_unreported();
  std::vector<at::Tensor> outputs_;
  const char* item_name_;  // "c10d::all_reduce", ...
  c10::DeviceIndex device_;
  std::chrono::milliseconds timeout_;
  std::string describe_;
  std::shared_ptr<Completion> completion_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::unique_ptr<runtime::Event> done_event_;  // neuron: recorded after the completion item
};

}  // namespace openneuron::aten::distributed
