// What the dense CUTLASS GEMMs (cutlass_gemm_sm90.cuh, cutlass_gemm_fp8_sm90.cuh) share: the
// CUTLASS 3 headers they compose from, the hardware info of a persistent launch, the leading-
// dimension stride (common/cute_stride.cuh), and the checks before a launch.
#pragma once

#include <cstdio>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/kernel_hardware_info.h"
#include "primus_turbo/kernels/common/cute_stride.cuh"
#include "primus_turbo/kernels/gemm/cutlass_launch.cuh"
#include "primus_turbo/kernels/jit_abi.h"
#include "primus_turbo/kernels/jit_export.cuh"

namespace primus_turbo::kernels {

// The SMs a persistent kernel may use: num_sms when positive, else all of the device's.
inline cutlass::KernelHardwareInfo hardware_info(int device, int num_sms) {
  cutlass::KernelHardwareInfo hw_info;
  hw_info.device_id = device;
  hw_info.sm_count = num_sms > 0
                         ? num_sms
                         : cutlass::KernelHardwareInfo::query_device_multiprocessor_count(device);
  return hw_info;
}

// Before a launch: CUTLASS can implement args, and workspace_bytes holds its workspace. Returns 0,
// or 1 with err filled (`what` names the problem in the first message).
template <class Gemm>
int check_gemm(Gemm& gemm, const typename Gemm::Arguments& args, size_t workspace_bytes,
               const char* what, char* err, size_t err_len) {
  cutlass::Status status = gemm.can_implement(args);
  if (status != cutlass::Status::kSuccess) {
    std::snprintf(err, err_len, "CUTLASS cannot implement this %s: %s", what,
                  cutlassGetStatusString(status));
    return 1;
  }
  const size_t needed = Gemm::get_workspace_size(args);
  if (needed > workspace_bytes) {
    std::snprintf(err, err_len, "workspace too small: need %zu bytes, have %zu", needed,
                  workspace_bytes);
    return 1;
  }
  return 0;
}

}  // namespace primus_turbo::kernels
