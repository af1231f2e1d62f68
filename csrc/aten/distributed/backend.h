// The "neuron" c10d backend (DESIGN §7): every collective of c10d::Backend over a
// collectives::ShmComm (shared memory on one host; Gloo when the group spans hosts). Ordering
// as NCCL: a collective waits for the caller's current stream, runs in issue order on the
// group's communication thread (send/recv on one thread per peer, direction and tag), and
// Work.wait() makes the current stream wait for it. Registered from Python
// (openneuron/distributed.py).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <tuple>
#include <utility>
#include <vector>

#include "aten/distributed/work.h"
#include "collectives/shm_comm.h"
#include "runtime/stream.h"

namespace openneuron::aten::distributed {

// One thread running tasks in the order they were posted.
class CommThread {
 public:
  explicit CommThread(std::string name);
  ~CommThread();  // runs what is queued, then joins
  void post(std::function<void()> task);

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

class NeuronBackend : public c10d::Backend {
 public:
  // comm: the group's transport (owned). timeout: the group's default per collective.
  NeuronBackend(int rank, int size, std::string group_name,
                std::unique_ptr<collectives::ShmComm> comm, std::chrono::milliseconds timeout);
  ~NeuronBackend() override;

  const std::string getBackendName() const override { return "neuron"; }
  c10::intrusive_ptr<Options> getBackendOptions() override;
  void setTimeout(std::chrono::milliseconds timeout) override;
  bool supportsCoalescing() const override { return false; }
  // split_group and DeviceMesh sub-meshes (with a bound device): the ranks in `ranks` (group
  // ranks of this group) form a new group through openneuron/distributed.py's rendezvous on
  // `store`; the others get null.
  bool supportsSplitting() const override { return true; }
  // The number of collectives posted on this group (every rank posts the same ones).
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return seq_.load(); }
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store,
                                          const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<Options>& opts) override;
  void shutdown() override;
  void abort() override { shutdown(); }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;

 private:
  struct Call;  // one collective being posted (below)
  using Task = std::function<void(collectives::ShmComm&)>;
  c10::intrusive_ptr<c10d::Work> post(Call& call, Task task);
  // A call of this backend's own (no tensors) in issue order with the collectives.
  c10::intrusive_ptr<c10d::Work> post_task(const char* op, Task task);
  std::string describe(const char* op) const;
  // What a finished collective held (work.h): dropped by drain_grave() on an issuing thread.
  struct Remains {
    std::vector<at::Tensor> tensors;
    c10::intrusive_ptr<NeuronWork> work;
  };
  void bury(Remains remains);
  void drain_grave();
  // The stream each device's collectives complete on (a high-priority pool stream, as NCCL's).
  runtime::Stream comm_stream(c10::DeviceIndex device);
  std::chrono::milliseconds timeout_of(std::chrono::milliseconds requested) const;
  CommThread& p2p_thread(int peer, bool send, int tag);

  std::string group_name_;
  std::atomic<uint64_t> seq_{0};
  std::unique_ptr<collectives::ShmComm> comm_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<CommThread> thread_;
  std::mutex p2p_mu_;
  std::map<std::tuple<int, bool, int>, std::unique_ptr<CommThread>> p2p_threads_;
  std::map<c10::DeviceIndex, runtime::Stream> comm_streams_;  // under p2p_mu_
  std::mutex grave_mu_;
  std::vector<Remains> grave_;
  // split(): the child made for the first device type (null where this rank is left out),
  // handed to the second (create.cpp).
  bool last_split_pending_ = false;
  c10::intrusive_ptr<c10d::Backend> last_split_;
  std::vector<int> last_split_ranks_;
};

// One collective being posted: what it is called, the tensors it reads/writes and returns.
struct NeuronBackend::Call {
  const char* op;
  c10d::OpType type;
  std::chrono::milliseconds timeout;
  std::vector<at::Tensor> outputs;  // result() / the future
  std::vector<at::Tensor> keep;     // everything the transport touches
  bool p2p = false;
  int peer = -1;
  bool send = false;
  int tag = 0;
};

// The options getBackendOptions() returns (copyable from Python: split_group deep-copies them).
struct NeuronBackendOptions : c10d::Backend::Options {
  explicit NeuronBackendOptions(std::chrono::milliseconds timeout) : Options("neuron", timeout) {}
};

// The transports a group runs over, as openneuron/distributed.py agreed them through the store:
// shared memory (segment `shm`) when every rank is on this host; Gloo (`gloo`, every rank) when
// the group spans hosts, plus, when each host holds `local_size` consecutive ranks, shared
// memory inside the host (`shm`) and Gloo among the hosts' leaders (`leaders`, local rank 0).
struct Transports {
  std::string shm;
  int local_size = 0;
  c10::intrusive_ptr<c10d::Backend> gloo;
  c10::intrusive_ptr<c10d::Backend> leaders;
};

// Joins the transports (waits for every rank) and returns the backend.
c10::intrusive_ptr<c10d::Backend> make_backend(int rank, int size,
                                               std::chrono::milliseconds timeout,
                                               const std::string& group_name,
                                               const Transports& transports);

// How split() builds a group: set by the Python layer at registration (its rendezvous).
using SplitFactory = std::function<c10::intrusive_ptr<c10d::Backend>(
    const c10::intrusive_ptr<c10d::Store>&, int rank, int size, std::chrono::milliseconds,
    const std::string& group_name)>;
void set_split_factory(SplitFactory factory);

}  // namespace openneuron::aten::distributed
