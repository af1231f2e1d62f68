// The sync points of a traced NKI program (kSync: nisa.core_barrier, nisa.sendrecv): the
// parse-time rules that let a launch's instances run phase by phase, and the data a sendrecv
// moves between phases. The phased run itself is run.cpp's (run_phased).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "nki/convert.h"
#include "nki/program.h"

namespace openneuron::nki {

namespace {

bool has_branches(const Program& p) {
  for (const std::vector<Instr>& instrs : p.instances)
    for (const Instr& in : instrs)
      if (in.kind == Kind::kBranch) return true;
  return false;
}

}  // namespace

std::string kernel_where(const Program& p, const Instr& in) {
  return (in.line >= 0 && static_cast<size_t>(in.line) < p.lines.size()
              ? p.lines[static_cast<size_t>(in.line)]
              : std::string("<unknown>")) +
         ": in kernel '" + p.name + "': ";
}

std::string sync_step_error(const Program& p, const std::vector<const Instr*>& at) {
  const size_t n = at.size();
  size_t ended = 0;
  for (const Instr* in : at) ended += in == nullptr ? 1 : 0;
  if (ended == n) return {};
  if (ended > 0) {
    size_t g = 0, h = 0;
    while (at[g] != nullptr) ++g;  // ended
    while (at[h] == nullptr) ++h;  // waits
    return kernel_where(p, *at[h]) + "instance " + std::to_string(h) + " reaches a " +
           (at[h]->sync_send < 0 ? "core barrier" : "sendrecv") + " that instance " +
           std::to_string(g) +
           " never reaches (it ended); every NeuronCore of a launch must reach the same core "
           "barriers / sendrecvs, in the same order (on the hardware the others would wait "
           "forever)";
  }
  const bool barrier = at[0]->sync_send < 0;
  for (size_t g = 0; g < n; ++g) {
    const Instr& in = *at[g];
    if ((in.sync_send < 0) != barrier)
      return kernel_where(p, in) + "instance " + std::to_string(g) + " reaches a " +
             (barrier ? "sendrecv" : "core barrier") + " where instance 0 reaches a " +
             (barrier ? "core barrier" : "sendrecv");
    if (barrier) continue;
    const auto peer = static_cast<size_t>(in.sync_recv);
    if (peer >= n || static_cast<size_t>(in.sync_send) >= n)
      return kernel_where(p, in) + "sendrecv between instance " + std::to_string(g) + " and rank " +
             std::to_string(peer >= n ? in.sync_recv : in.sync_send) + " of a launch of " +
             std::to_string(n);
    const Instr& from = *at[peer];
    if (static_cast<size_t>(from.sync_send) != g)
      return kernel_where(p, in) + "sendrecv: instance " + std::to_string(g) +
             " receives from rank " + std::to_string(peer) + ", which sends to rank " +
             std::to_string(from.sync_send);
    if (from.extent[0] != in.extent[0] || from.extent[1] != in.extent[1])
      return kernel_where(p, in) + "sendrecv: instance " + std::to_string(g) + " receives [" +
             std::to_string(in.extent[0]) + ", " + std::to_string(in.extent[1]) + "] from rank " +
             std::to_string(peer) + ", which sends [" + std::to_string(from.extent[0]) + ", " +
             std::to_string(from.extent[1]) + "]";
  }
  return {};
}

// Without run-time loops every instance's sync points are known when parsed: the rules of
// sync_step_error hold for each k-th point of every instance, and the count is the same.
void find_sync_points(Program& p) {
  const size_t n = p.instances.size();
  std::vector<std::vector<const Instr*>> points(n);
  for (size_t g = 0; g < n; ++g)
    for (const Instr& in : p.instances[g])
      if (in.kind == Kind::kSync) points[g].push_back(&in);
  for (size_t g = 0; g < n; ++g) p.has_sync = p.has_sync || !points[g].empty();
  if (!p.has_sync || has_branches(p)) return;  // with loops: checked as they run
  const size_t count = points[0].size();
  for (size_t g = 1; g < n; ++g)
    if (points[g].size() != count) {
      const size_t extra = std::min(count, points[g].size());
      const Instr& at = points[g].size() > count ? *points[g][extra] : *points[0][extra];
      throw std::invalid_argument(
          kernel_where(p, at) + "instance " + std::to_string(g) + " reaches " +
          std::to_string(points[g].size()) + " core barriers / sendrecvs and instance 0 " +
          std::to_string(count) +
          "; every NeuronCore of a launch must reach the same ones, in the same order (on the "
          "hardware the others would wait forever)");
    }
  std::vector<const Instr*> at(n);
  for (size_t k = 0; k < count; ++k) {
    for (size_t g = 0; g < n; ++g) at[g] = points[g][k];
    const std::string error = sync_step_error(p, at);
    if (!error.empty()) throw std::invalid_argument(error);
  }
}

// The data of the sync points the instances reached (at[g]: instance g's): each sendrecv's
// source read first (into a staging copy, in its dtype), then written into its receiver's dst
// (converted when the dtypes differ), so an exchange through shared HBM reads the old values.
void run_sync(const std::vector<const Instr*>& at, const std::vector<std::vector<char*>>& slots) {
  const size_t n = at.size();
  auto sync = [&](size_t g) -> const Instr& { return *at[g]; };
  if (sync(0).sync_send < 0) return;  // a barrier: reaching it was all
  std::vector<std::vector<char>> staged(n);
  for (size_t g = 0; g < n; ++g) {
    const Instr& in = sync(g);
    const Operand& s = sync(static_cast<size_t>(in.sync_recv)).src[0];
    const char* base = slots[static_cast<size_t>(in.sync_recv)][static_cast<size_t>(s.slot)];
    const int64_t size = static_cast<int64_t>(dtype_size(s.dtype));
    staged[g].resize(static_cast<size_t>(in.extent[0] * in.extent[1] * size));
    char* to = staged[g].data();
    for (int64_t q = 0; q < in.extent[0]; ++q)
      for (int64_t f = 0; f < in.extent[1]; ++f, to += size)
        std::memcpy(to, base + (s.offset + s.stride[0] * q + s.stride[1] * f) * size,
                    static_cast<size_t>(size));
  }
  for (size_t g = 0; g < n; ++g) {
    const Instr& in = sync(g);
    const Operand& s = sync(static_cast<size_t>(in.sync_recv)).src[0];
    const Operand& d = in.dst;
    char* base = slots[g][static_cast<size_t>(d.slot)];
    const int64_t size = static_cast<int64_t>(dtype_size(d.dtype));
    const char* from = staged[g].data();
    int64_t i = 0;
    for (int64_t q = 0; q < in.extent[0]; ++q)
      for (int64_t f = 0; f < in.extent[1]; ++f, ++i) {
        const int64_t at = d.offset + d.stride[0] * q + d.stride[1] * f;
        if (s.dtype == d.dtype)  // bit for bit, as a DMA moves them
          std::memcpy(base + at * size, from + i * size, static_cast<size_t>(size));
        else
          store_one(d.dtype, base, at, load_one(s.dtype, from, i));
      }
  }
}

}  // namespace openneuron::nki
