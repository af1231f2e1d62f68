// The transport of a group that spans hosts: the collectives of collectives::ShmComm over a
// ProcessGroupGloo of the same ranks, on CPU tensors viewing the buffers (a neuron buffer is
// host memory). Gloo numbers its collectives per group, and every rank issues them in the same
// order from the group's communication thread, as Gloo requires.
#include "aten/distributed/gloo_comm.h"

#include <cstring>
#include <string>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <utility>
#include <vector>

#include "aten/dtype.h"
#include "collectives/reduce.h"

namespace openneuron::aten::distributed {

namespace coll = openneuron::collectives;

namespace {

at::Tensor view(const void* p, size_t count, coll::DType dt) {
  return at::from_blob(const_cast<void*>(p), {static_cast<int64_t>(count)},
                       at::TensorOptions().dtype(scalar_type_of(dt)));
}
at::Tensor bytes(const void* p, size_t n) { return view(p, n, coll::DType::kUInt8); }

class GlooComm final : public coll::ShmComm {
 public:
  GlooComm(int rank, int size, const coll::Options& opts, c10::intrusive_ptr<c10d::Backend> gloo)
      : ShmComm(rank, size, opts), gloo_(std::move(gloo)) {}

  // Reductions: Gloo moves the bytes; this rank reduces them with the shared-memory path's
  // kernel, in rank order (bf16/fp16 in float32, rounded once), so a group spanning hosts
  // computes bitwise what one host would, for every dtype and op.
  void all_reduce(const void* in, void* out, size_t count, coll::DType dt,
                  coll::ReduceOp op) override {
    const size_t b = count * coll::dtype_size(dt);
    std::vector<uint8_t> all(b * size_);
    all_gather(in, all.data(), b);
    reduce_blocks(out, all.data(), b, count, dt, op);
  }
  void reduce(const void* in, void* out, size_t count, coll::DType dt, coll::ReduceOp op,
              int root) override {
    const size_t b = count * coll::dtype_size(dt);
    std::vector<uint8_t> all(rank_ == root ? b * size_ : 0);
    gather(in, all.data(), b, root);
    if (rank_ == root) reduce_blocks(out, all.data(), b, count, dt, op);
  }
  void broadcast(void* buf, size_t n, int root) override {
    std::vector<at::Tensor> t{bytes(buf, n)};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    o.timeout = timeout();
    run("broadcast", gloo_->broadcast(t, o));
  }
  void all_gather(const void* in, void* out, size_t n) override {
    at::Tensor i = bytes(in, n), o = bytes(out, n * size_);
    c10d::AllgatherOptions opt;
    opt.timeout = timeout();
    run("all_gather", gloo_->_allgather_base(o, i, opt));
  }
  void reduce_scatter(const void* in, void* out, size_t count, coll::DType dt,
                      coll::ReduceOp op) override {
    // Block p of every rank's input to rank p (one all-to-all), then this rank's reduction.
    const size_t b = count * coll::dtype_size(dt);
    std::vector<size_t> off(size_), len(size_, b);
    for (int p = 0; p < size_; ++p) off[p] = b * p;
    std::vector<uint8_t> mine(b * size_);
    all_to_all(in, off.data(), len.data(), mine.data(), off.data(), len.data());
    reduce_blocks(out, mine.data(), b, count, dt, op);
  }
  void all_to_all(const void* in, const size_t* send_offsets, const size_t* send_bytes, void* out,
                  const size_t* recv_offsets, const size_t* recv_bytes) override {
    size_t sn = 0, rn = 0;
    std::vector<int64_t> ss, rs;
    for (int p = 0; p < size_; ++p) {
      sn = std::max(sn, send_offsets[p] + send_bytes[p]);
      rn = std::max(rn, recv_offsets[p] + recv_bytes[p]);
      ss.push_back(static_cast<int64_t>(send_bytes[p]));
      rs.push_back(static_cast<int64_t>(recv_bytes[p]));
    }
    at::Tensor i = bytes(in, sn), o = bytes(out, rn);
    c10d::AllToAllOptions opt;
    opt.timeout = timeout();
    run("all_to_all", gloo_->alltoall_base(o, i, rs, ss, opt));
  }
  void gather(const void* in, void* out, size_t n, int root) override {
    std::vector<at::Tensor> i{bytes(in, n)};
    std::vector<std::vector<at::Tensor>> o(rank_ == root ? 1 : 0);
    if (rank_ == root)
      for (int r = 0; r < size_; ++r) o[0].push_back(bytes(static_cast<uint8_t*>(out) + r * n, n));
    c10d::GatherOptions opt;
    opt.rootRank = root;
    opt.timeout = timeout();
    run("gather", gloo_->gather(o, i, opt));
  }
  void scatter(const void* in, void* out, size_t n, int root) override {
    std::vector<at::Tensor> o{bytes(out, n)};
    std::vector<std::vector<at::Tensor>> i(rank_ == root ? 1 : 0);
    if (rank_ == root)
      for (int r = 0; r < size_; ++r)
        i[0].push_back(bytes(static_cast<const uint8_t*>(in) + r * n, n));
    c10d::ScatterOptions opt;
    opt.rootRank = root;
    opt.timeout = timeout();
    run("scatter", gloo_->scatter(o, i, opt));
  }
  void barrier() override {
    c10d::BarrierOptions opt;
    opt.timeout = timeout();
    run("barrier", gloo_->barrier(opt));
  }
  void send(const void* buf, size_t n, int peer, int tag) override {
    std::vector<at::Tensor> t{bytes(buf, n)};
    run("send", gloo_->send(t, peer, tag));
  }
  void recv(void* buf, size_t n, int peer, int tag) override {
    std::vector<at::Tensor> t{bytes(buf, n)};
    run("recv", gloo_->recv(t, peer, tag));
  }

 private:
  // out = blocks[0] op blocks[1] op ... (size() blocks of b bytes), left to right.
  void reduce_blocks(void* out, const uint8_t* blocks, size_t b, size_t count, coll::DType dt,
                     coll::ReduceOp op) {
    std::vector<const void*> ins(size_);
    for (int r = 0; r < size_; ++r) ins[r] = blocks + r * b;
    coll::reduce_many(out, ins.data(), size_, count, dt, op);
  }
  // Waits for a Gloo work; its failure becomes a CommError naming the call and the group.
  void run(const char* what, const c10::intrusive_ptr<c10d::Work>& w) {
    try {
      w->wait(timeout());
    } catch (const std::exception& e) {
      throw coll::CommError(std::string("neuron collectives: ") + what + " on group '" +
                            opts_.group_name + "' (rank " + std::to_string(rank_) + " of " +
                            std::to_string(size_) +
                            ", inter-host leg over Gloo) failed: " + e.what());
    }
  }
  c10::intrusive_ptr<c10d::Backend> gloo_;
};

}  // namespace

std::unique_ptr<coll::ShmComm> make_gloo_comm(int rank, int size, const coll::Options& opts,
                                              c10::intrusive_ptr<c10d::Backend> gloo) {
  return std::make_unique<GlooComm>(rank, size, opts, std::move(gloo));
}

}  // namespace openneuron::aten::distributed
