#include "bindings/torch/fp4_quantize.h"

#include "primus_turbo/gemm_mx.h"

namespace primus_turbo::torch_binding {

namespace {

constexpr int64_t kMx = 32;

}  // namespace

std::pair<std::optional<Fp4>, std::optional<Fp4>> quantize_fp4(const Tensor& x, bool want_row, bool want_col,
                                                               int32_t flags, int64_t seed, int32_t device,
                                                               void* stream) {
  const int64_t m = x.sizes()[0], k = x.sizes()[1];
  const bool two_d = flags & PT_QUANT_2D_BLOCK;
  std::optional<Fp4> row, col;
  pt_tensor px = to_pt(x), pqr{}, psr{}, pqc{}, psc{};
  if (want_row) {
    row = Fp4{empty({m, k / 2}, ScalarType::Byte, device),
              empty({two_d ? cdiv(m, kMx) : m, cdiv(k, kMx)}, ScalarType::Byte, device)};
    pqr = to_pt(row->q);
    psr = to_pt(row->s);
  }
  if (want_col) {
    col = Fp4{empty({k, m / 2}, ScalarType::Byte, device),
              empty({two_d ? cdiv(k, kMx) : k, cdiv(m, kMx)}, ScalarType::Byte, device)};
    pqc = to_pt(col->q);
    psc = to_pt(col->s);
  }
  check_status(pt_quantize(&px, row ? &pqr : nullptr, row ? &psr : nullptr, col ? &pqc : nullptr,
                           col ? &psc : nullptr, PT_QUANT_MX_BLOCKWISE, static_cast<int32_t>(kMx), 1, flags,
                           static_cast<uint64_t>(seed), nullptr, 0, stream),
               "FP4 quantize");
  return {row, col};
}

Quantized restate(const Fp4& x, bool mn_major, int32_t device, void* stream) {
  const int64_t rows = x.q.sizes()[0], k = 2 * x.q.sizes()[1], kb = cdiv(k, 128);
  Tensor s = mn_major ? empty({kb, cdiv(rows, 4) * 4}, ScalarType::Float, device)
                      : empty({rows, kb}, ScalarType::Float, device);
  Quantized out{empty({rows, k}, ScalarType::Float8_e4m3fn, device), s, PT_FP8_SCALING_BLOCK_1x128};
  const pt_tensor pq = to_pt(x.q), ps = to_pt(x.s);
  pt_tensor pq8 = to_pt(out.q), ps8 = to_pt(out.s);
  check_status(mn_major ? pt_mx_to_blocks_mn_major(&pq, &ps, &pq8, &ps8, stream)
                        : pt_mx_to_blocks(&pq, &ps, &pq8, &ps8, stream),
               "FP4 restatement");
  return out;
}

}  // namespace primus_turbo::torch_binding
