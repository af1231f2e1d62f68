// Python bindings of the per-op path counters (bind_ops of bindings.h): _C._ops_report() lists
// (op_name, path, calls, seconds) for every op that ran, path in native/async/sync/fallback;
// _C._ops_report_reset() zeroes them. Formatting is openneuron/_ops_report.py.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <tuple>
#include <vector>

#include "aten/bindings.h"
#include "aten/ops/meta_cache.h"
#include "aten/ops/op_table.h"
#include "aten/origin_capture.h"

namespace openneuron::aten {

void bind_ops(pybind11::module_& m) {
  origin_install();
  m.def(
      "_ops_report",
      [] {
        std::vector<std::tuple<std::string, std::string, uint64_t, double>> rows;
        for (OpInfo* info : op_info_all()) {
          uint64_t native = info->native_calls.load();
          uint64_t async = info->async_calls.load();
          uint64_t fallback = info->fallback_calls.load();
          uint64_t sync = info->sync_calls.load();
          if (native) rows.emplace_back(info->name, "native", native, 0.0);
          if (async) rows.emplace_back(info->name, "async", async, 0.0);
          if (fallback)
            rows.emplace_back(info->name, "fallback", fallback,
                              static_cast<double>(info->fallback_ns.load()) * 1e-9);
          if (sync)
            rows.emplace_back(info->name, "sync", sync,
                              static_cast<double>(info->sync_ns.load()) * 1e-9);
        }
        return rows;
      },
      "Per-op call counts by path (native/async/sync/fallback) and seconds spent in the "
      "synchronous paths.");
  m.def(
      "_ops_report_reset",
      [] {
        for (OpInfo* info : op_info_all()) {
          info->native_calls = 0;
          info->async_calls = 0;
          info->fallback_calls = 0;
          info->fallback_ns = 0;
          info->sync_calls = 0;
          info->sync_ns = 0;
        }
      },
      "Zeroes the per-op counters of _ops_report.");
  m.def("_meta_cache_clear", &meta_cache_clear, "Empties the fallback's meta-result cache.");
}

}  // namespace openneuron::aten
