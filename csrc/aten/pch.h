// Precompiled header for csrc/aten: the torch headers every glue file needs. Nothing else
// includes torch outside csrc/aten.
#pragma once

// NOTE: Python.h must come first (it sets feature macros); include sorting would move it.
// clang-format off
#include <Python.h>
// clang-format on

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/library.h>
