// Macros a generated JIT translation unit uses to export one kernel through the C ABI of jit_abi.h.
#pragma once

#include "primus_turbo/kernels/jit_abi.h"

#define PT_JIT_EXPORT_ABI_VERSION \
  extern "C" __attribute__((visibility("default"))) int pt_jit_abi_version() { \
    return PT_JIT_ABI_VERSION;                                                  \
  }

// Exports Kernel::run and Kernel::workspace as pt_gemm_run / pt_gemm_workspace.
#define PT_JIT_EXPORT_GEMM(Kernel)                                                          \
  PT_JIT_EXPORT_ABI_VERSION                                                                 \
  extern "C" __attribute__((visibility("default"))) int pt_gemm_run(                        \
      const PtGemmParams* params, char* err, size_t err_len) {                              \
    return Kernel::run(params, err, err_len);                                               \
  }                                                                                         \
  extern "C" __attribute__((visibility("default"))) int pt_gemm_workspace(                  \
      const PtGemmParams* params, size_t* bytes, char* err, size_t err_len) {               \
    return Kernel::workspace(params, bytes, err, err_len);                                  \
  }

// Exports Kernel::forward and Kernel::backward as pt_norm_fwd_run / pt_norm_bwd_run.
#define PT_JIT_EXPORT_NORM(Kernel)                                                          \
  PT_JIT_EXPORT_ABI_VERSION                                                                 \
  extern "C" __attribute__((visibility("default"))) int pt_norm_fwd_run(                    \
      const PtNormFwdParams* params, char* err, size_t err_len) {                           \
    return Kernel::forward(params, err, err_len);                                           \
  }                                                                                         \
  extern "C" __attribute__((visibility("default"))) int pt_norm_bwd_run(                    \
      const PtNormBwdParams* params, char* err, size_t err_len) {                           \
    return Kernel::backward(params, err, err_len);                                          \
  }

// Exports Kernel::forward and Kernel::backward as pt_gated_fwd_run / pt_gated_bwd_run.
#define PT_JIT_EXPORT_GATED(Kernel)                                                         \
  PT_JIT_EXPORT_ABI_VERSION                                                                 \
  extern "C" __attribute__((visibility("default"))) int pt_gated_fwd_run(                   \
      const PtGatedActParams* params, char* err, size_t err_len) {                          \
    return Kernel::forward(params, err, err_len);                                           \
  }                                                                                         \
  extern "C" __attribute__((visibility("default"))) int pt_gated_bwd_run(                   \
      const PtGatedActParams* params, char* err, size_t err_len) {                          \
    return Kernel::backward(params, err, err_len);                                          \
  }

// Forward-only modules (the FP8-output variants, whose backward is the plain module's).
#define PT_JIT_EXPORT_NORM_FWD(Kernel)                                                      \
  PT_JIT_EXPORT_ABI_VERSION                                                                 \
  extern "C" __attribute__((visibility("default"))) int pt_norm_fwd_run(                    \
      const PtNormFwdParams* params, char* err, size_t err_len) {                           \
    return Kernel::forward(params, err, err_len);                                           \
  }

#define PT_JIT_EXPORT_GATED_FWD(Kernel)                                                     \
  PT_JIT_EXPORT_ABI_VERSION                                                                 \
  extern "C" __attribute__((visibility("default"))) int pt_gated_fwd_run(                   \
      const PtGatedActParams* params, char* err, size_t err_len) {                          \
    return Kernel::forward(params, err, err_len);                                           \
  }
