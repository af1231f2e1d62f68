// The sync points of a traced NKI program (kSync: nisa.core_barrier, nisa.sendrecv): the
// parse-time rules that let a launch's instances run phase by phase, and the data a sendrecv
// moves between phases. The phased run itself is program.cpp's (run_phased).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "nki/convert.h"
#include "nki/program.h"

namespace openneuron::nki {

// Program::sync_groups / sync_instrs, and the rules that let instances run phase by phase:
// every instance reaches the same number of sync points, the k-th one of each is a barrier in
// all of them or a sendrecv in all of them, and each sendrecv's peer names it back over a box of
// the same shape.
void find_sync_points(Program& p) {
  const size_t n = p.instances.size();
  auto fail = [&](const Instr& at, const std::string& what) {
    const std::string line =
        at.line >= 0 ? p.lines[static_cast<size_t>(at.line)] : std::string("<unknown>");
    throw std::invalid_argument(line + ": in kernel '" + p.name + "': " + what);
  };
  for (size_t g = 0; g < n; ++g) {
    p.sync_groups.emplace_back();
    p.sync_instrs.emplace_back();
    const std::vector<Group>& sched = p.schedules[g];
    for (size_t k = 0; k < sched.size(); ++k)
      if (p.rewritten[g][static_cast<size_t>(sched[k].begin)].kind == Kind::kSync)
        p.sync_groups[g].push_back(static_cast<int32_t>(k));
    for (size_t i = 0; i < p.instances[g].size(); ++i)
      if (p.instances[g][i].kind == Kind::kSync)
        p.sync_instrs[g].push_back(static_cast<int32_t>(i));
  }
  const size_t points = p.sync_instrs[0].size();
  for (size_t g = 1; g < n; ++g)
    if (p.sync_instrs[g].size() != points) {
      const size_t extra = std::min(points, p.sync_instrs[g].size());
      const Instr& at = p.sync_instrs[g].size() > points
                            ? p.instances[g][static_cast<size_t>(p.sync_instrs[g][extra])]
                            : p.instances[0][static_cast<size_t>(p.sync_instrs[0][extra])];
      fail(at, "instance " + std::to_string(g) + " reaches " +
                   std::to_string(p.sync_instrs[g].size()) +
                   " core barriers / sendrecvs and instance 0 " + std::to_string(points) +
                   "; every NeuronCore of a launch must reach the same ones, in the same order "
                   "(on the hardware the others would wait forever)");
    }
  for (size_t k = 0; k < points; ++k) {
    auto sync = [&](size_t g) -> const Instr& {
      return p.instances[g][static_cast<size_t>(p.sync_instrs[g][k])];
    };
    const bool barrier = sync(0).sync_send < 0;
    for (size_t g = 0; g < n; ++g) {
      const Instr& in = sync(g);
      if ((in.sync_send < 0) != barrier)
        fail(in, "instance " + std::to_string(g) + " reaches a " +
                     (barrier ? "sendrecv" : "core barrier") + " where instance 0 reaches a " +
                     (barrier ? "core barrier" : "sendrecv"));
      if (barrier) continue;
      const auto peer = static_cast<size_t>(in.sync_recv);
      if (peer >= n || static_cast<size_t>(in.sync_send) >= n)
        fail(in, "sendrecv between instance " + std::to_string(g) + " and rank " +
                     std::to_string(peer >= n ? in.sync_recv : in.sync_send) + " of a launch of " +
                     std::to_string(n));
      const Instr& from = sync(peer);
      if (static_cast<size_t>(from.sync_send) != g)
        fail(in, "sendrecv: instance " + std::to_string(g) + " receives from rank " +
                     std::to_string(peer) + ", which sends to rank " +
                     std::to_string(from.sync_send));
      if (from.extent[0] != in.extent[0] || from.extent[1] != in.extent[1])
        fail(in, "sendrecv: instance " + std::to_string(g) + " receives [" +
                     std::to_string(in.extent[0]) + ", " + std::to_string(in.extent[1]) +
                     "] from rank " + std::to_string(peer) + ", which sends [" +
                     std::to_string(from.extent[0]) + ", " + std::to_string(from.extent[1]) + "]");
    }
  }
}

// The data of every instance's k-th sync point once all reached it: each sendrecv's source
// read first (into a staging copy, in its dtype), then written into its receiver's dst
// (converted when the dtypes differ), so an exchange through shared HBM reads the old values.
void run_sync(const Program& p, size_t k, const std::vector<std::vector<char*>>& slots) {
  const size_t n = p.instances.size();
  auto sync = [&](size_t g) -> const Instr& {
    return p.instances[g][static_cast<size_t>(p.sync_instrs[g][k])];
  };
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
