// The tracer's program encoding (openneuron/nki/_trace.py encode()) written by hand, for the NKI
// executor's gtests (test_nki.cpp, test_nki_isa.cpp). Not a tracer: no checks of its own.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "nki/program.h"

namespace openneuron::nki::nki_test {

inline int64_t f64(double d) {
  int64_t w;
  std::memcpy(&w, &d, sizeof w);
  return w;
}

struct Encoder {
  std::vector<int64_t> w;
  explicit Encoder(std::vector<int64_t> slots) {
    w = {0x4E4B4931, static_cast<int64_t>(slots.size())};
    w.insert(w.end(), slots.begin(), slots.end());
  }
  void operand(int type, int slot, int64_t offset, std::vector<int64_t> strides, double v = 0,
               DType dtype = DType::k_float32) {
    w.insert(w.end(), {type, static_cast<int64_t>(dtype), slot, offset});
    w.insert(w.end(), strides.begin(), strides.end());
    w.push_back(f64(v));
  }
  void header(int kind, std::vector<int64_t> extent, int nreduce = 0,
              int reduce_op = static_cast<int>(Op::k_add), bool acc = false, int line = -1) {
    w.insert(w.end(), {kind, static_cast<int64_t>(extent.size())});
    w.insert(w.end(), extent.begin(), extent.end());
    w.insert(w.end(),
             {nreduce, reduce_op, acc ? 1 : 0, static_cast<int>(Op::k_add), f64(1.0), line});
  }
  std::unique_ptr<Program> parse(std::vector<std::string> lines = {}) {
    return std::unique_ptr<Program>(program_parse(w.data(), w.size(), "test", std::move(lines)));
  }
};

}  // namespace openneuron::nki::nki_test
