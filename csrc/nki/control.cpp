// Run-time control flow of a traced NKI program (kBranch: the loops of nl.dynamic_range,
// nl.fori_loop and nl.while_loop, traced once and run as many times as their registers say, and
// nl.if_else): the parse-time rules, each branch's condition, the guard against a loop that
// never ends; and the integer scalars those read (kScalar: NkiScalar arithmetic). Following the
// jumps is run.cpp's (follow). Semantics: Instr in program.h.
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "nki/convert.h"
#include "nki/program.h"

namespace openneuron::nki {
namespace {

int64_t read_int(const Operand& o, char* const* slots) {
  return load_integer(o.dtype, slots[o.slot], o.offset);  // a view: the parser's rule
}

}  // namespace

void find_branches(Program& p) {
  for (size_t g = 0; g < p.instances.size(); ++g) {
    const std::vector<Instr>& instrs = p.instances[g];
    const std::vector<Group>& groups = p.schedules[g];
    const size_t n = instrs.size();
    for (size_t i = 0; i < n; ++i) {
      const Instr& in = instrs[i];
      if (in.kind != Kind::kBranch) continue;
      auto fail = [&](const std::string& what) {
        throw std::invalid_argument(kernel_where(p, in) + what);
      };
      const auto to = static_cast<size_t>(in.br_target);
      if (to > n) fail("branch target " + std::to_string(to) + " past the program's end");
      // The target starts a group: no group straddles it (the tracer puts a branch before it or
      // a branch at it, and a branch is a group of its own).
      size_t k = 0;
      while (k < groups.size() && static_cast<size_t>(groups[k].end) <= to) ++k;
      if (k < groups.size() && static_cast<size_t>(groups[k].begin) < to)
        fail("malformed branch: its target is inside a group of the schedule");
      p.rewritten[g][i].br_group = static_cast<int32_t>(k);
    }
  }
}

bool branch_taken(const Instr& in, char* const* slots) {
  auto write = [&](int64_t v) {  // exactly, past float32's 2^24 (registers are int32)
    reinterpret_cast<int32_t*>(slots[in.dst.slot])[in.dst.offset] = static_cast<int32_t>(v);
  };
  switch (in.br_cond) {
    case kBrExitGe:
    case kBrExitZero: {
      const int64_t v = read_int(in.src[0], slots);
      if (in.br_cond == kBrExitGe ? v >= read_int(in.src[1], slots) : v == 0) return true;
      if (in.dst.type == Operand::kView) write(v);
      return false;
    }
    case kBrStep:  // a counted loop's counter; saturated, it still reaches an int32 stop
      write(std::min<int64_t>(read_int(in.dst, slots) + in.br_step, INT32_MAX));
      return true;
    default:
      return true;
  }
}

void loop_guard(const Program& p, const Instr& in, int64_t* count) {
  if (++*count <= kMaxBackJumps) return;
  throw std::runtime_error(
      kernel_where(p, in) + "a run-time loop has gone round " + std::to_string(kMaxBackJumps) +
      " times in one launch and is stopped (on the hardware a loop whose condition never "
      "ends it hangs the NeuronCore): check the register its condition reads (nl.while_loop: the "
      "register the body returns must become 0)");
}

void run_scalar(const Program& p, const Instr& in, char* const* slots) {
  auto value = [&](int i) {
    const Operand& o = in.src[static_cast<size_t>(i)];
    return o.type == Operand::kView ? read_int(o, slots) : in.sc_const[i];
  };
  const int64_t a = static_cast<int32_t>(static_cast<uint32_t>(value(0)));  // int32 operands
  const int64_t b = static_cast<int32_t>(static_cast<uint32_t>(value(1)));
  int64_t v = 0;
  switch (in.sc_op) {
    case Op::k_neg:
      v = -a;
      break;
    case Op::k_add:
      v = a + b;
      break;
    case Op::k_subtract:
      v = a - b;
      break;
    case Op::k_multiply:
      v = a * b;
      break;
    case Op::k_divide:
    case Op::k_mod:
      if (b == 0)
        throw std::runtime_error(kernel_where(p, in) + "integer scalar division by zero (" +
                                 std::to_string(a) + (in.sc_op == Op::k_divide ? " / 0" : " % 0") +
                                 ")");
      v = in.sc_op == Op::k_divide ? a / b : a % b;  // toward zero; the remainder takes a's sign
      break;
    case Op::k_maximum:
      v = std::max(a, b);
      break;
    case Op::k_minimum:
      v = std::min(a, b);
      break;
    case Op::k_less:
      v = a < b;
      break;
    case Op::k_less_equal:
      v = a <= b;
      break;
    case Op::k_greater:
      v = a > b;
      break;
    case Op::k_greater_equal:
      v = a >= b;
      break;
    case Op::k_equal:
      v = a == b;
      break;
    case Op::k_not_equal:
      v = a != b;
      break;
    default:  // copy
      v = a;
  }
  reinterpret_cast<int32_t*>(slots[in.dst.slot])[in.dst.offset] =
      static_cast<int32_t>(static_cast<uint32_t>(v));  // wraps, as 32-bit hardware does
}

}  // namespace openneuron::nki
