// A grouped GEMM call reduced to what a kernel needs: the packed extent, the fixed sizes, how the
// groups split the operands, and which dimension of each kernel operand is contiguous.
#pragma once

#include <cstdint>
#include <string>

#include "primus_turbo/grouped_gemm.h"

namespace primus_turbo::grouped_gemm {

// The persistent grid of a grouped kernel asked to use at most `requested` SMs (0: all): the GPU's
// count, or the request rounded down to a whole number of 2-CTA clusters (a cluster launch needs
// its grid to be a multiple of the cluster), at least one cluster.
inline int persistent_sms(int requested, int sm_count) {
  if (requested <= 0 || requested >= sm_count) return sm_count;
  return requested < 2 ? 2 : requested & ~1;
}

struct Problem {
  bool wgrad = false;   // groups split the reduction (wgrad) rather than the output rows
  bool trans_b = false;
  int64_t groups = 0;   // G
  int64_t rows = 0;     // M: the packed extent the host knows
  // The caller's sizes: a [rows, k]; forward b [G, k, n] / [G, n, k]; wgrad b [rows, n].
  int64_t n = 0, k = 0;
  int32_t dtype = PT_BFLOAT16;
  const int64_t* group_lens = nullptr;
  const int64_t* group_offs = nullptr;
  const void* a = nullptr;
  const void* b = nullptr;
  void* d = nullptr;
  bool aligned16 = false;  // every base pointer
  int32_t num_sms = 0;     // SMs the persistent kernel may use; 0: all
  int sm_budget(int sm_count) const { return persistent_sms(num_sms, sm_count); }

  // The kernel's view. Forward: A = a (K-major), B = b[g] (N- or K-major), D = d rows; fixed
  // kernel sizes (n, k). Wgrad: D[g] [km, kn] = A^T B with A, B M-/N-major over the packed rows:
  // (A, B) = (a, grad) without trans_b, (grad, a) with it.
  const void* kernel_a() const { return wgrad && trans_b ? b : a; }
  const void* kernel_b() const { return wgrad && trans_b ? a : b; }
  int64_t kernel_m() const { return wgrad ? (trans_b ? n : k) : 0; }
  int64_t kernel_n() const { return wgrad && trans_b ? k : n; }
  int64_t kernel_k() const { return wgrad ? 0 : k; }
  // "AkBn" etc.: the contiguous dimension of the kernel's A and B; names modules and keys.
  std::string layout_code() const;
};

// Validates every tensor (dtype, rank, shape, contiguity) and canonicalizes. Messages name the
// argument and what was expected.
Problem make_problem(const pt_grouped_gemm_args* args);

}  // namespace primus_turbo::grouped_gemm
