// The c10d Work of the "neuron" process-group backend (DESIGN §7): completed by the group's
// communication thread; wait() makes the caller's current neuron stream wait for it (as NCCL's
// does: no host sync) or, for CPU tensors, blocks the host; its future carries the outputs.
#pragma once

#include <atomic>
#include <chrono>
#include <exception>
#include <string>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

namespace openneuron::aten::distributed {

class NeuronWork : public c10d::Work {
 public:
  // outputs: what result() and the future return. on_neuron: the tensors are neuron tensors
  // (wait() blocks the current stream of `device`), else CPU (wait() blocks the host).
  // describe: "all_reduce on group 'x' (rank r of n)", for timeout messages.
  NeuronWork(int rank, c10d::OpType type, const char* title, std::vector<at::Tensor> outputs,
             bool on_neuron, c10::DeviceIndex device, std::chrono::milliseconds timeout,
             std::string describe);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override;
  void synchronize() override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void blockCurrentStream() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

  // The communication thread's end of it: results are in place (or e says why not). Releases
  // the tensors the collective used (`keep`), then completes the future.
  void complete(std::exception_ptr e);
  // Tensors the collective reads or writes, held until complete() (the memory must not be
  // reused while the communication thread still uses it).
  std::vector<at::Tensor>& keep() { return keep_; }
  // Blocks the host until complete or `timeout` (<= 0: bound()). false = timed out.
  bool wait_host(std::chrono::milliseconds timeout);
  // How long a wait with no timeout of its own may take: 2x the group's timeout, at least 30 s
  // more (the transport's own timeout error, naming the peer, comes first).
  std::chrono::milliseconds bound() const;

 private:
  std::vector<at::Tensor> outputs_;
  std::vector<at::Tensor> keep_;
  bool on_neuron_;
  c10::DeviceIndex device_;
  std::chrono::milliseconds timeout_;
  std::string describe_;
  std::atomic<bool> done_{false};
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace openneuron::aten::distributed
