// The JIT modules of MoE routing: one per logits dtype (routing forward + backward, every experts
// width), and one dtype-generic module of the helpers (indices <-> multihot, tokens mask).
#pragma once

#include <cstdint>
#include <string>

#include "primus_turbo/kernels/moe_routing/routing_abi.h"

namespace primus_turbo::moe_routing {

struct RoutingKernels {
  PtRoutingFwdFn forward = nullptr;
  PtRoutingBwdFn backward = nullptr;
};

struct UtilKernels {
  PtMultihotFn multihot_forward = nullptr;
  PtMultihotFn multihot_backward = nullptr;
  PtTokensMaskFn tokens_mask = nullptr;
};

// Build or load (memoized); arch is an nvcc arch such as "90a".
RoutingKernels load_routing(int32_t dtype, const std::string& arch);
UtilKernels load_utils(const std::string& arch);

}  // namespace primus_turbo::moe_routing
