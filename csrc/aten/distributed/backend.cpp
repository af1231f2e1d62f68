// The "neuron" c10d backend's machinery (backend.h): the communication threads, posting a call
// in issue order with its stream ordering and Work, what finished calls leave behind, point to
// point and barrier. Each collective's mapping onto ShmComm is collectives.cpp.
// NOTE: a neuron tensor's memory is host memory (the software NeuronCore), so the transport
// reads and writes device buffers directly; the tensors are held by the Work until it completes.
#include "aten/distributed/backend.h"

#include <c10/util/Exception.h>

#include <cstring>
#include <exception>
#include <sstream>
#include <tuple>
#include <utility>

#include "aten/distributed/backend_util.h"
#include "aten/distributed/work.h"
#include "aten/dtype.h"
#include "aten/ops/host_views.h"
#include "runtime/event.h"
#include "runtime/stream.h"

namespace openneuron::aten::distributed {

namespace coll = openneuron::collectives;

// --- CommThread -----------------------------------------------------------------------------

CommThread::CommThread(std::string name) : thread_([this] { loop(); }) {
  pthread_setname_np(thread_.native_handle(), name.substr(0, 15).c_str());
}

CommThread::~CommThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void CommThread::post(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void CommThread::loop() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

// --- helpers shared with collectives.cpp (backend_util.h) -------------------------------------

std::string shape_of(const at::Tensor& t) {
  std::ostringstream s;
  s << t.sizes() << " " << t.scalar_type() << " on " << t.device();
  return s.str();
}

at::Tensor host_of(const at::Tensor& t) {
  if (!t.device().is_privateuseone()) return t;
  return host_view_fresh(buffer_of(t), geom_of(t));
}

size_t nbytes(const at::Tensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); }

void check_one(const std::vector<at::Tensor>& ts, const std::string& what) {
  TORCH_CHECK(ts.size() == 1, "neuron collectives: ", what, ": one tensor per call (got ",
              ts.size(), "); multi-tensor collectives are deprecated in torch.distributed");
}

// --- NeuronBackend: posting, threads, streams --------------------------------------------------

NeuronBackend::NeuronBackend(int rank, int size, std::string group_name,
                             std::unique_ptr<coll::ShmComm> comm, std::chrono::milliseconds timeout)
    : c10d::Backend(rank, size),
      group_name_(std::move(group_name)),
      comm_(std::move(comm)),
      timeout_(timeout),
      thread_(std::make_unique<CommThread>("neuron-c10d")) {}

NeuronBackend::~NeuronBackend() { shutdown(); }

void NeuronBackend::shutdown() {
  // NOTE: joins after the queued collectives ran (each bounded by its timeout).
  std::map<std::tuple<int, bool, int>, std::unique_ptr<CommThread>> p2p;
  {
    std::lock_guard<std::mutex> lock(p2p_mu_);
    p2p.swap(p2p_threads_);
  }
  p2p.clear();
  thread_.reset();
  drain_grave();
}

void NeuronBackend::setTimeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }

std::string NeuronBackend::describe(const char* op) const {
  return std::string(op) + " on group '" + group_name_ + "' (rank " + std::to_string(rank_) +
         " of " + std::to_string(size_) + ")";
}

std::chrono::milliseconds NeuronBackend::timeout_of(std::chrono::milliseconds requested) const {
  return requested.count() > 0 ? requested : timeout_;
}

CommThread& NeuronBackend::p2p_thread(int peer, bool send, int tag) {
  // NOTE: one thread per (peer, direction, tag): messages of one tag stay FIFO, and a recv
  // waiting for one tag never holds up another tag's (Gloo's sends wait for their recv).
  // Tags beyond kP2PTags share threads.
  constexpr int kP2PTags = 64;
  const int slot = ((tag % kP2PTags) + kP2PTags) % kP2PTags;
  std::lock_guard<std::mutex> lock(p2p_mu_);
  auto& t = p2p_threads_[{peer, send, slot}];
  if (!t)
    t = std::make_unique<CommThread>((send ? "neuron-send" : "neuron-recv") + std::to_string(peer));
  return *t;
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::post(Call& call, Task task) {
  drain_grave();  // what finished collectives left, dropped here on the issuing thread
  TORCH_CHECK(thread_ != nullptr, "neuron collectives: ", describe(call.op),
              ": the process group was shut down");
  bool on_neuron = false;
  c10::DeviceIndex device = -1;
  for (const at::Tensor& t : call.keep) {
    TORCH_CHECK(t.defined(), "neuron collectives: ", describe(call.op), ": undefined tensor");
    const bool n = t.device().is_privateuseone();
    TORCH_CHECK(n || t.device().is_cpu(), "neuron collectives: ", describe(call.op),
                ": tensors must be on neuron or cpu, got ", shape_of(t));
    if (n) {
      TORCH_CHECK(device < 0 || device == t.device().index(),
                  "neuron collectives: ", describe(call.op),
                  ": tensors on two devices (neuron:", device, " and ", t.device(),
                  "); use one device per process");
      device = t.device().index();
      on_neuron = true;
    }
    TORCH_CHECK(t.is_contiguous() || t.numel() <= 1, "neuron collectives: ", describe(call.op),
                ": tensors must be contiguous, got ", shape_of(t), " with strides ", t.strides(),
                "; call .contiguous() first");
    int pairs = 1;
    TORCH_CHECK(comm_dtype(t.scalar_type(), &pairs).has_value(),
                "neuron collectives: ", describe(call.op), ": dtype ", t.scalar_type(),
                " is not supported (float32/64, bfloat16, float16, int8-int64, uint8, bool, "
                "complex)");
  }
  if (!call.p2p) seq_.fetch_add(1, std::memory_order_relaxed);
  auto work = c10::make_intrusive<NeuronWork>(rank_, call.type, call.op, call.outputs, device,
                                              call.timeout, describe(call.op));
  std::shared_ptr<runtime::Event> ready;
  if (on_neuron) {
    // NOTE: the transport starts once the caller's stream has produced the inputs (and every
    // earlier write to the outputs); recording runs the fusion flush hook first.
    ready = std::make_shared<runtime::Event>();
    ready->record(runtime::stream_current(device));
  }
  // NOTE: the tensors the transport reads and writes live until it is done; then they (and, for
  // CPU tensors, the Work whose future the thread completes) are buried, never dropped on the
  // communication thread (work.h).
  auto run = [this, c = work->completion(), ready, task = std::move(task),
              keep = std::move(call.keep), cpu_work = on_neuron ? nullptr : work,
              timeout = call.timeout]() mutable {
    std::exception_ptr error;
    try {
      if (ready) {
        try {
          ready->synchronize();
        } catch (const std::exception&) {
          // NOTE: an earlier op on the stream failed: that error is the user's to see at the
          // next sync; the peers still get this rank's (possibly stale) data, never a hang.
        }
      }
      comm_->set_timeout(timeout);
      run_comm([&] { task(*comm_); });
    } catch (...) {
      error = std::current_exception();
    }
    c->complete(error);
    task = nullptr;  // host views only
    Remains remains{std::move(keep), std::move(cpu_work)};
    if (remains.work) remains.work->complete_future();
    bury(std::move(remains));
  };
  if (call.p2p)
    p2p_thread(call.peer, call.send, call.tag).post(std::move(run));
  else
    thread_->post(std::move(run));
  if (on_neuron) work->enqueue_completion(comm_stream(device));
  return work;
}

void NeuronBackend::bury(Remains remains) {
  std::lock_guard<std::mutex> lock(grave_mu_);
  grave_.push_back(std::move(remains));
}

void NeuronBackend::drain_grave() {
  std::vector<Remains> dead;
  {
    std::lock_guard<std::mutex> lock(grave_mu_);
    dead.swap(grave_);
  }
}

runtime::Stream NeuronBackend::comm_stream(c10::DeviceIndex device) {
  std::lock_guard<std::mutex> lock(p2p_mu_);
  auto it = comm_streams_.find(device);
  if (it == comm_streams_.end()) {
    it = comm_streams_
             .emplace(device, runtime::stream_from_pool(device, runtime::kStreamPriorityHigh))
             .first;
  }
  return it->second;
}

// --- point to point and the backend's own calls -----------------------------------------------

c10::intrusive_ptr<c10d::Work> NeuronBackend::send(std::vector<at::Tensor>& tensors, int dst,
                                                   int tag) {
  check_one(tensors, describe("send"));
  TORCH_CHECK(dst >= 0 && dst < size_ && dst != rank_, "neuron collectives: ", describe("send"),
              ": destination ", dst, " is not another rank of the group");
  Call call{"send", c10d::OpType::SEND, timeout_, tensors, tensors, true, dst, true, tag};
  return post(call, [h = host_of(tensors[0]), dst, tag](coll::ShmComm& c) {
    c.send(h.data_ptr(), nbytes(h), dst, tag);
  });
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::recv(std::vector<at::Tensor>& tensors, int src,
                                                   int tag) {
  check_one(tensors, describe("recv"));
  TORCH_CHECK(src >= 0 && src < size_ && src != rank_, "neuron collectives: ", describe("recv"),
              ": source ", src, " is not another rank of the group");
  Call call{"recv", c10d::OpType::RECV, timeout_, tensors, tensors, true, src, false, tag};
  return post(call, [h = host_of(tensors[0]), src, tag](coll::ShmComm& c) {
    c.recv(h.data_ptr(), nbytes(h), src, tag);
  });
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::post_task(const char* op, Task task) {
  Call call{op, c10d::OpType::UNKNOWN, timeout_, {}, {}};
  return post(call, std::move(task));
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::barrier(const c10d::BarrierOptions& opts) {
  Call call{"barrier", c10d::OpType::BARRIER, timeout_of(opts.timeout), {}, {}};
  return post(call, [](coll::ShmComm& c) { c.barrier(); });
}

void NeuronBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool /*wait_all_ranks*/) {
  // NOTE: the transport's timeout error names the ranks that did not arrive.
  c10::intrusive_ptr<c10d::Work> w = barrier(opts);
  w->wait();
}

}  // namespace openneuron::aten::distributed
