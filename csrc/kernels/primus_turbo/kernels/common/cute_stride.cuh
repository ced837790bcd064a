// The leading-dimension stride of a packed GEMM operand in CuTe form, shared by the dense and the
// grouped CUTLASS GEMMs.
#pragma once

#include <cstdint>

#include "cute/tensor.hpp"

namespace primus_turbo::kernels {

// A rank-3 CuTe stride (M|N, K, L) with one dynamic mode, the leading dimension: set that mode to
// ld (the unit mode and the batch mode stay static).
template <class Stride>
__host__ __device__ Stride leading_stride(int64_t ld) {
  Stride s{};
  if constexpr (cute::is_static<cute::remove_cvref_t<decltype(cute::get<0>(s))>>::value) {
    cute::get<1>(s) = ld;
  } else {
    cute::get<0>(s) = ld;
  }
  return s;
}

}  // namespace primus_turbo::kernels
