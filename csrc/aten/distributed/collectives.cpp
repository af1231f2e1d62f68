// The "neuron" c10d backend's collectives: argument checks and the mapping of each c10d call
// onto ShmComm's raw-pointer collectives (AVG / PREMUL_SUM around the transport's sum, complex
// as pairs of reals, coalesced and list forms). Posting and ordering: backend.cpp.
// NOTE: a neuron tensor's memory is host memory (the software NeuronCore), so the transport
// reads and writes device buffers directly; the tensors are held by the Work until it completes.
#include <c10/util/Exception.h>

#include <cstring>
#include <utility>

#include "aten/distributed/backend.h"
#include "aten/distributed/backend_util.h"
#include "aten/dtype.h"

namespace openneuron::aten::distributed {

namespace coll = openneuron::collectives;

// --- argument checks --------------------------------------------------------------------------

namespace {

coll::ReduceOp reduce_op_of(const c10d::ReduceOp& op, const std::string& what) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
    case c10d::ReduceOp::AVG:
    case c10d::ReduceOp::PREMUL_SUM:
      return coll::ReduceOp::kSum;
    case c10d::ReduceOp::PRODUCT:
      return coll::ReduceOp::kProduct;
    case c10d::ReduceOp::MIN:
      return coll::ReduceOp::kMin;
    case c10d::ReduceOp::MAX:
      return coll::ReduceOp::kMax;
    case c10d::ReduceOp::BAND:
      return coll::ReduceOp::kBand;
    case c10d::ReduceOp::BOR:
      return coll::ReduceOp::kBor;
    case c10d::ReduceOp::BXOR:
      return coll::ReduceOp::kBxor;
    default:
      TORCH_CHECK(false, "neuron collectives: ", what, ": unsupported reduce op ",
                  static_cast<int>(op.op_));
  }
}

// The scalar PREMUL_SUM multiplies each input by (read after the caller's stream has produced
// it, on the communication thread).
double premul_factor(const c10d::ReduceOp& op) {
  auto* s = dynamic_cast<c10d::PreMulSumSupplement*>(op.supplement_.get());
  TORCH_CHECK(s != nullptr, "neuron collectives: PREMUL_SUM without a factor");
  if (!s->tensor_factor.defined()) return s->double_factor;
  return host_of(s->tensor_factor).to(at::kDouble).item<double>();
}

// After a kSum: AVG divides by the group size (integers truncate, as NCCL's).
void finish_avg(const at::Tensor& host, int size) {
  if (c10::isIntegralType(host.scalar_type(), false))
    host.div_(size, "trunc");
  else
    host.div_(size);
}

}  // namespace

// --- collectives ----------------------------------------------------------------------------

namespace {

// Element count and dtype for the transport (complex as pairs of reals).
std::pair<size_t, coll::DType> elems(const at::Tensor& t) {
  int pairs = 1;
  const coll::DType dt = *comm_dtype(t.scalar_type(), &pairs);
  return {static_cast<size_t>(t.numel()) * pairs, dt};
}

void check_reduce(const at::Tensor& t, const c10d::ReduceOp& op, const std::string& what) {
  const bool complex = t.is_complex();
  TORCH_CHECK(!complex || op.op_ == c10d::ReduceOp::SUM || op.op_ == c10d::ReduceOp::AVG ||
                  op.op_ == c10d::ReduceOp::PREMUL_SUM,
              "neuron collectives: ", what, ": reduce op ", static_cast<int>(op.op_),
              " is not defined for complex tensors (", t.scalar_type(), ")");
  const bool bitwise = op.op_ == c10d::ReduceOp::BAND || op.op_ == c10d::ReduceOp::BOR ||
                       op.op_ == c10d::ReduceOp::BXOR;
  TORCH_CHECK(!bitwise || !c10::isFloatingType(t.scalar_type()), "neuron collectives: ", what,
              ": bitwise reduce ops take integer or bool tensors, got ", t.scalar_type());
  TORCH_CHECK(op.op_ != c10d::ReduceOp::AVG || t.scalar_type() != at::kBool,
              "neuron collectives: ", what, ": AVG of bool tensors is undefined");
}

// Runs a reduction with AVG / PREMUL_SUM applied around the transport's kSum:
// transport(in, out, dtype) reduces `in` into `out` (undefined where this rank gets nothing).
// in may be scaled (PREMUL_SUM) in place only when it is the caller's output buffer too.
// NOTE: bfloat16/float16 AVG and PREMUL_SUM are scaled and summed in float32 and rounded once
// (twice the bytes moved), as their SUM is; scaling in the tensor's dtype rounds twice.
template <class F>
void reduce_with(const c10d::ReduceOp& op, const at::Tensor& in_host, const at::Tensor& out_host,
                 int size, coll::DType dt, F&& transport) {
  const bool avg = op.op_ == c10d::ReduceOp::AVG, premul = op.op_ == c10d::ReduceOp::PREMUL_SUM;
  const at::ScalarType st = in_host.scalar_type();
  if ((avg || premul) && (st == at::kBFloat16 || st == at::kHalf)) {
    at::Tensor in = in_host.to(at::kFloat);
    if (premul) in.mul_(premul_factor(op));
    at::Tensor out =
        out_host.defined() ? at::empty({out_host.numel()}, in.options()) : at::Tensor();
    transport(in, out, coll::DType::kFloat32);
    if (!out.defined()) return;
    if (avg) out.div_(size);
    out_host.copy_(out.view(out_host.sizes()));
    return;
  }
  at::Tensor in = in_host;
  if (premul) {
    const double f = premul_factor(op);
    if (in_host.is_same(out_host))
      in.mul_(f);
    else
      in = in_host.mul(f);
  }
  transport(in, out_host, dt);
  if (avg && out_host.defined()) finish_avg(out_host, size);
}

// The data pointer of a tensor that may be undefined (a rank that receives nothing).
void* ptr_or_null(const at::Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

}  // namespace

c10::intrusive_ptr<c10d::Work> NeuronBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                        const c10d::AllreduceOptions& opts) {
  check_one(tensors, describe("all_reduce"));
  const at::Tensor& t = tensors[0];
  check_reduce(t, opts.reduceOp, describe("all_reduce"));
  Call call{"all_reduce", c10d::OpType::ALLREDUCE, timeout_of(opts.timeout), tensors, tensors};
  const coll::ReduceOp op = reduce_op_of(opts.reduceOp, describe("all_reduce"));
  auto [count, dt] = elems(t);
  return post(call,
              [h = host_of(t), rop = opts.reduceOp, op, count, dt, size = size_](coll::ShmComm& c) {
                reduce_with(rop, h, h, size, dt,
                            [&](const at::Tensor& in, const at::Tensor& out, coll::DType d) {
                              c.all_reduce(in.data_ptr(), out.data_ptr(), count, d, op);
                            });
              });
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  std::vector<at::Tensor> hosts;
  for (const at::Tensor& t : tensors) {
    check_reduce(t, opts.reduceOp, describe("all_reduce_coalesced"));
    hosts.push_back(host_of(t));
  }
  Call call{"all_reduce_coalesced", c10d::OpType::ALLREDUCE_COALESCED, timeout_of(opts.timeout),
            tensors, tensors};
  const coll::ReduceOp op = reduce_op_of(opts.reduceOp, describe("all_reduce_coalesced"));
  return post(call, [hosts, rop = opts.reduceOp, op, size = size_](coll::ShmComm& c) {
    for (const at::Tensor& h : hosts) {
      auto [count, dt] = elems(h);
      reduce_with(rop, h, h, size, dt,
                  [&](const at::Tensor& in, const at::Tensor& out, coll::DType d) {
                    c.all_reduce(in.data_ptr(), out.data_ptr(), count, d, op);
                  });
    }
  });
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::reduce(std::vector<at::Tensor>& tensors,
                                                     const c10d::ReduceOptions& opts) {
  check_one(tensors, describe("reduce"));
  const at::Tensor& t = tensors[0];
  check_reduce(t, opts.reduceOp, describe("reduce"));
  const int root = static_cast<int>(opts.rootRank);
  TORCH_CHECK(root >= 0 && root < size_, "neuron collectives: ", describe("reduce"), ": root ",
              root, " is not a rank of the group");
  Call call{"reduce", c10d::OpType::REDUCE, timeout_of(opts.timeout), tensors, tensors};
  const coll::ReduceOp op = reduce_op_of(opts.reduceOp, describe("reduce"));
  auto [count, dt] = elems(t);
  const bool is_root = root == rank_;
  return post(call, [h = host_of(t), rop = opts.reduceOp, op, count, dt, root, is_root,
                     size = size_](coll::ShmComm& c) {
    // NOTE: a non-root's input stays as it was (PREMUL_SUM scales a copy there).
    reduce_with(rop, h, is_root ? h : at::Tensor(), size, dt,
                [&](const at::Tensor& in, const at::Tensor& out, coll::DType d) {
                  c.reduce(in.data_ptr(), ptr_or_null(out), count, d, op, root);
                });
  });
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                        const c10d::BroadcastOptions& opts) {
  check_one(tensors, describe("broadcast"));
  const int root = static_cast<int>(opts.rootRank);
  TORCH_CHECK(root >= 0 && root < size_, "neuron collectives: ", describe("broadcast"), ": root ",
              root, " is not a rank of the group");
  Call call{"broadcast", c10d::OpType::BROADCAST, timeout_of(opts.timeout), tensors, tensors};
  return post(call, [h = host_of(tensors[0]), root](coll::ShmComm& c) {
    c.broadcast(h.data_ptr(), nbytes(h), root);
  });
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                              const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(
      output.scalar_type() == input.scalar_type() && output.numel() == input.numel() * size_,
      "neuron collectives: ", describe("all_gather_into_tensor"),
      ": the output must hold group size (", size_, ") x the input: input ", shape_of(input),
      ", output ", shape_of(output));
  Call call{"all_gather_into_tensor",
            c10d::OpType::_ALLGATHER_BASE,
            timeout_of(opts.timeout),
            {output},
            {output, input}};
  return post(call, [in = host_of(input), out = host_of(output)](coll::ShmComm& c) {
    c.all_gather(in.data_ptr(), out.data_ptr(), nbytes(in));
  });
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(),
              "neuron collectives: ", describe("all_gather_into_tensor_coalesced"), ": ",
              outputs.size(), " outputs for ", inputs.size(), " inputs");
  std::vector<std::pair<at::Tensor, at::Tensor>> pairs;
  std::vector<at::Tensor> keep;
  for (size_t i = 0; i < inputs.size(); ++i) {
    TORCH_CHECK(outputs[i].scalar_type() == inputs[i].scalar_type() &&
                    outputs[i].numel() == inputs[i].numel() * size_,
                "neuron collectives: ", describe("all_gather_into_tensor_coalesced"), ": output ",
                i, " must hold group size x input ", i, ": input ", shape_of(inputs[i]),
                ", output ", shape_of(outputs[i]));
    pairs.emplace_back(host_of(inputs[i]), host_of(outputs[i]));
    keep.push_back(outputs[i]);
    keep.push_back(inputs[i]);
  }
  Call call{"all_gather_into_tensor_coalesced", c10d::OpType::COALESCED, timeout_of(opts.timeout),
            outputs, keep};
  return post(call, [pairs](coll::ShmComm& c) {
    for (const auto& [in, out] : pairs) c.all_gather(in.data_ptr(), out.data_ptr(), nbytes(in));
  });
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  check_one(inputs, describe("all_gather"));
  TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_,
              "neuron collectives: ", describe("all_gather"), ": needs a list of ", size_,
              " output tensors");
  const at::Tensor& input = inputs[0];
  std::vector<at::Tensor> keep{input}, outs;
  for (const at::Tensor& o : outputs[0]) {
    TORCH_CHECK(o.numel() == input.numel() && o.scalar_type() == input.scalar_type(),
                "neuron collectives: ", describe("all_gather"),
                ": every output must match the input: input ", shape_of(input), ", output ",
                shape_of(o));
    keep.push_back(o);
    outs.push_back(host_of(o));
  }
  Call call{"all_gather", c10d::OpType::ALLGATHER, timeout_of(opts.timeout), outputs[0], keep};
  return post(call, [in = host_of(input), outs](coll::ShmComm& c) {
    const size_t b = nbytes(in);
    std::vector<uint8_t> all(b * outs.size());
    c.all_gather(in.data_ptr(), all.data(), b);
    for (size_t r = 0; r < outs.size(); ++r) std::memcpy(outs[r].data_ptr(), &all[r * b], b);
  });
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(),
              "neuron collectives: ", describe("all_gather_coalesced"), ": ", outputs.size(),
              " output lists for ", inputs.size(), " inputs");
  std::vector<at::Tensor> keep, flat_outputs;
  std::vector<std::pair<at::Tensor, std::vector<at::Tensor>>> items;
  for (size_t i = 0; i < inputs.size(); ++i) {
    TORCH_CHECK(static_cast<int>(outputs[i].size()) == size_,
                "neuron collectives: ", describe("all_gather_coalesced"), ": output list ", i,
                " needs ", size_, " tensors");
    std::vector<at::Tensor> outs;
    for (const at::Tensor& o : outputs[i]) {
      TORCH_CHECK(o.numel() == inputs[i].numel() && o.scalar_type() == inputs[i].scalar_type(),
                  "neuron collectives: ", describe("all_gather_coalesced"),
                  ": every output must match its input: input ", shape_of(inputs[i]), ", output ",
                  shape_of(o));
      keep.push_back(o);
      flat_outputs.push_back(o);
      outs.push_back(host_of(o));
    }
    keep.push_back(inputs[i]);
    items.emplace_back(host_of(inputs[i]), std::move(outs));
  }
  Call call{"all_gather_coalesced", c10d::OpType::ALLGATHER_COALESCED, timeout_of(opts.timeout),
            flat_outputs, keep};
  return post(call, [items](coll::ShmComm& c) {
    for (const auto& [in, outs] : items) {
      const size_t b = nbytes(in);
      std::vector<uint8_t> all(b * outs.size());
      c.all_gather(in.data_ptr(), all.data(), b);
      for (size_t r = 0; r < outs.size(); ++r) std::memcpy(outs[r].data_ptr(), &all[r * b], b);
    }
  });
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::GatherOptions& opts) {
  check_one(inputs, describe("gather"));
  const int root = static_cast<int>(opts.rootRank);
  TORCH_CHECK(root >= 0 && root < size_, "neuron collectives: ", describe("gather"), ": root ",
              root, " is not a rank of the group");
  const at::Tensor& input = inputs[0];
  std::vector<at::Tensor> keep{input}, outs, result;
  if (root == rank_) {
    TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_,
                "neuron collectives: ", describe("gather"), ": the root needs a list of ", size_,
                " output tensors");
    for (const at::Tensor& o : outputs[0]) {
      TORCH_CHECK(o.numel() == input.numel() && o.scalar_type() == input.scalar_type(),
                  "neuron collectives: ", describe("gather"),
                  ": every output must match the input: input ", shape_of(input), ", output ",
                  shape_of(o));
      keep.push_back(o);
      outs.push_back(host_of(o));
    }
    result = outputs[0];
  } else {
    TORCH_CHECK(outputs.empty() || outputs[0].empty(), "neuron collectives: ", describe("gather"),
                ": only the root (rank ", root, ") passes outputs");
  }
  Call call{"gather", c10d::OpType::GATHER, timeout_of(opts.timeout), result, keep};
  return post(call, [in = host_of(input), outs, root](coll::ShmComm& c) {
    const size_t b = nbytes(in);
    std::vector<uint8_t> all(outs.empty() ? 0 : b * outs.size());
    c.gather(in.data_ptr(), outs.empty() ? nullptr : all.data(), b, root);
    for (size_t r = 0; r < outs.size(); ++r) std::memcpy(outs[r].data_ptr(), &all[r * b], b);
  });
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::scatter(std::vector<at::Tensor>& outputs,
                                                      std::vector<std::vector<at::Tensor>>& inputs,
                                                      const c10d::ScatterOptions& opts) {
  check_one(outputs, describe("scatter"));
  const int root = static_cast<int>(opts.rootRank);
  TORCH_CHECK(root >= 0 && root < size_, "neuron collectives: ", describe("scatter"), ": root ",
              root, " is not a rank of the group");
  const at::Tensor& output = outputs[0];
  std::vector<at::Tensor> keep{output}, ins;
  if (root == rank_) {
    TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_,
                "neuron collectives: ", describe("scatter"), ": the root needs a list of ", size_,
                " input tensors");
    for (const at::Tensor& i : inputs[0]) {
      TORCH_CHECK(i.numel() == output.numel() && i.scalar_type() == output.scalar_type(),
                  "neuron collectives: ", describe("scatter"),
                  ": every input must match the output: output ", shape_of(output), ", input ",
                  shape_of(i));
      keep.push_back(i);
      ins.push_back(host_of(i));
    }
  }
  Call call{"scatter", c10d::OpType::SCATTER, timeout_of(opts.timeout), outputs, keep};
  return post(call, [out = host_of(output), ins, root](coll::ShmComm& c) {
    const size_t b = nbytes(out);
    std::vector<uint8_t> all(ins.empty() ? 0 : b * ins.size());
    for (size_t r = 0; r < ins.size(); ++r) std::memcpy(&all[r * b], ins[r].data_ptr(), b);
    c.scatter(ins.empty() ? nullptr : all.data(), out.data_ptr(), b, root);
  });
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(
      output.scalar_type() == input.scalar_type() && input.numel() == output.numel() * size_,
      "neuron collectives: ", describe("reduce_scatter_tensor"),
      ": the input must hold group size (", size_, ") x the output: input ", shape_of(input),
      ", output ", shape_of(output));
  check_reduce(input, opts.reduceOp, describe("reduce_scatter_tensor"));
  Call call{"reduce_scatter_tensor",
            c10d::OpType::_REDUCE_SCATTER_BASE,
            timeout_of(opts.timeout),
            {output},
            {output, input}};
  const coll::ReduceOp op = reduce_op_of(opts.reduceOp, describe("reduce_scatter_tensor"));
  auto [count, dt] = elems(output);
  return post(call, [in = host_of(input), out = host_of(output), rop = opts.reduceOp, op, count, dt,
                     size = size_](coll::ShmComm& c) {
    reduce_with(rop, in, out, size, dt,
                [&](const at::Tensor& x, const at::Tensor& o, coll::DType d) {
                  c.reduce_scatter(x.data_ptr(), o.data_ptr(), count, d, op);
                });
  });
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(),
              "neuron collectives: ", describe("reduce_scatter_tensor_coalesced"), ": ",
              outputs.size(), " outputs for ", inputs.size(), " inputs");
  std::vector<std::pair<at::Tensor, at::Tensor>> pairs;
  std::vector<at::Tensor> keep;
  for (size_t i = 0; i < inputs.size(); ++i) {
    TORCH_CHECK(outputs[i].scalar_type() == inputs[i].scalar_type() &&
                    inputs[i].numel() == outputs[i].numel() * size_,
                "neuron collectives: ", describe("reduce_scatter_tensor_coalesced"), ": input ", i,
                " must hold group size x output ", i, ": input ", shape_of(inputs[i]), ", output ",
                shape_of(outputs[i]));
    check_reduce(inputs[i], opts.reduceOp, describe("reduce_scatter_tensor_coalesced"));
    pairs.emplace_back(host_of(inputs[i]), host_of(outputs[i]));
    keep.push_back(outputs[i]);
    keep.push_back(inputs[i]);
  }
  Call call{"reduce_scatter_tensor_coalesced", c10d::OpType::COALESCED, timeout_of(opts.timeout),
            outputs, keep};
  const coll::ReduceOp op =
      reduce_op_of(opts.reduceOp, describe("reduce_scatter_tensor_coalesced"));
  return post(call, [pairs, rop = opts.reduceOp, op, size = size_](coll::ShmComm& c) {
    for (const auto& [in, out] : pairs) {
      auto [count, dt] = elems(out);
      reduce_with(rop, in, out, size, dt,
                  [&](const at::Tensor& x, const at::Tensor& o, coll::DType d) {
                    c.reduce_scatter(x.data_ptr(), o.data_ptr(), count, d, op);
                  });
    }
  });
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  check_one(outputs, describe("reduce_scatter"));
  TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_,
              "neuron collectives: ", describe("reduce_scatter"), ": needs a list of ", size_,
              " input tensors");
  const at::Tensor& output = outputs[0];
  check_reduce(output, opts.reduceOp, describe("reduce_scatter"));
  std::vector<at::Tensor> keep{output}, ins;
  for (const at::Tensor& i : inputs[0]) {
    TORCH_CHECK(i.numel() == output.numel() && i.scalar_type() == output.scalar_type(),
                "neuron collectives: ", describe("reduce_scatter"),
                ": every input must match the output: output ", shape_of(output), ", input ",
                shape_of(i));
    keep.push_back(i);
    ins.push_back(host_of(i));
  }
  Call call{"reduce_scatter", c10d::OpType::REDUCE_SCATTER, timeout_of(opts.timeout), outputs,
            keep};
  const coll::ReduceOp op = reduce_op_of(opts.reduceOp, describe("reduce_scatter"));
  auto [count, dt] = elems(output);
  return post(call, [out = host_of(output), ins, rop = opts.reduceOp, op, count, dt,
                     size = size_](coll::ShmComm& c) {
    // The list packed into one buffer (a CPU tensor, so PREMUL_SUM can scale it in place).
    at::Tensor packed = at::stack(ins);
    reduce_with(rop, packed, out, size, dt,
                [&](const at::Tensor& x, const at::Tensor& o, coll::DType d) {
                  c.reduce_scatter(x.data_ptr(), o.data_ptr(), count, d, op);
                });
  });
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_split_sizes,
    std::vector<int64_t>& input_split_sizes, const c10d::AllToAllOptions& opts) {
  const std::string what = describe("all_to_all_single");
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "neuron collectives: ", what, ": input ",
              shape_of(input), " and output ", shape_of(output), " differ in dtype");
  // Splits are rows of dim 0; none = equal parts.
  auto offsets = [&](const at::Tensor& t, const std::vector<int64_t>& splits, const char* name,
                     std::vector<size_t>* off, std::vector<size_t>* bytes) {
    const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
    const size_t row_bytes = rows == 0 ? 0 : nbytes(t) / static_cast<size_t>(rows);
    if (splits.empty()) {
      TORCH_CHECK(rows % size_ == 0, "neuron collectives: ", what, ": ", name, " ", shape_of(t),
                  " does not split evenly over ", size_, " ranks; pass split sizes");
    } else {
      TORCH_CHECK(static_cast<int>(splits.size()) == size_, "neuron collectives: ", what, ": ",
                  splits.size(), " ", name, " split sizes for a group of ", size_);
      int64_t sum = 0;
      for (int64_t s : splits) sum += s;
      TORCH_CHECK(sum == rows, "neuron collectives: ", what, ": ", name, " split sizes sum to ",
                  sum, " but dim 0 of ", shape_of(t), " has ", rows);
    }
    size_t at = 0;
    for (int p = 0; p < size_; ++p) {
      const int64_t r = splits.empty() ? rows / size_ : splits[p];
      off->push_back(at);
      bytes->push_back(static_cast<size_t>(r) * row_bytes);
      at += bytes->back();
    }
  };
  std::vector<size_t> soff, sbytes, roff, rbytes;
  offsets(input, input_split_sizes, "input", &soff, &sbytes);
  offsets(output, output_split_sizes, "output", &roff, &rbytes);
  Call call{"all_to_all_single",
            c10d::OpType::ALLTOALL_BASE,
            timeout_of(opts.timeout),
            {output},
            {output, input}};
  return post(call, [in = host_of(input), out = host_of(output), soff, sbytes, roff,
                     rbytes](coll::ShmComm& c) {
    c.all_to_all(in.data_ptr(), soff.data(), sbytes.data(), out.data_ptr(), roff.data(),
                 rbytes.data());
  });
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const c10d::AllToAllOptions& opts) {
  const std::string what = describe("all_to_all");
  TORCH_CHECK(static_cast<int>(outputs.size()) == size_ && static_cast<int>(inputs.size()) == size_,
              "neuron collectives: ", what, ": needs ", size_, " inputs and outputs, got ",
              inputs.size(), " and ", outputs.size());
  std::vector<at::Tensor> keep, ins, outs;
  for (int p = 0; p < size_; ++p) {
    TORCH_CHECK(inputs[p].scalar_type() == outputs[p].scalar_type(), "neuron collectives: ", what,
                ": input ", p, " ", shape_of(inputs[p]), " and output ", p, " ",
                shape_of(outputs[p]), " differ in dtype");
    keep.push_back(inputs[p]);
    keep.push_back(outputs[p]);
    ins.push_back(host_of(inputs[p]));
    outs.push_back(host_of(outputs[p]));
  }
  Call call{"all_to_all", c10d::OpType::ALLTOALL, timeout_of(opts.timeout), outputs, keep};
  return post(call, [ins, outs](coll::ShmComm& c) {
    std::vector<size_t> soff, sbytes, roff, rbytes;
    size_t s = 0, r = 0;
    for (size_t p = 0; p < ins.size(); ++p) {
      soff.push_back(s);
      sbytes.push_back(nbytes(ins[p]));
      s += sbytes.back();
      roff.push_back(r);
      rbytes.push_back(nbytes(outs[p]));
      r += rbytes.back();
    }
    std::vector<uint8_t> send(s), recv(r);
    for (size_t p = 0; p < ins.size(); ++p)
      std::memcpy(&send[soff[p]], ins[p].data_ptr(), sbytes[p]);
    c.all_to_all(send.data(), soff.data(), sbytes.data(), recv.data(), roff.data(), rbytes.data());
    for (size_t p = 0; p < outs.size(); ++p)
      std::memcpy(outs[p].data_ptr(), &recv[roff[p]], rbytes[p]);
  });
}

}  // namespace openneuron::aten::distributed
