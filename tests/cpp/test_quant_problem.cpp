// Quantization problems: which outputs, their expected shapes for every granularity, the scale
// layout dequantization derives, and the argument errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "ops/quantization/quant_problem.h"
#include "test_util.h"

namespace {

using primus_turbo::quant::make_dequant_problem;
using primus_turbo::quant::make_quant_problem;
using primus_turbo::quant::workspace_bytes;
using pt_test::error_of;
using ::testing::HasSubstr;

alignas(64) unsigned char g_buf[1 << 12];

pt_tensor tensor(int32_t dtype, std::vector<int64_t> shape) {
  pt_tensor t{};
  t.data = g_buf;
  t.dtype = dtype;
  t.ndim = static_cast<int32_t>(shape.size());
  int64_t stride = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    t.shape[i] = shape[i];
    t.strides[i] = stride;
    stride *= shape[i];
  }
  return t;
}

constexpr int64_t M = 300, K = 200;  // neither a multiple of 128 nor of 32

TEST(QuantProblem, BlockwiseRowAndTransposedColumn) {
  const pt_tensor x = tensor(PT_BFLOAT16, {M, K});
  pt_tensor q_row = tensor(PT_FLOAT8_E4M3, {M, K}), s_row = tensor(PT_FLOAT32, {M, 2});
  pt_tensor q_col = tensor(PT_FLOAT8_E4M3, {K, M}), s_col = tensor(PT_FLOAT32, {K, 3});
  const auto p = make_quant_problem(&x, &q_row, &s_row, &q_col, &s_col, PT_QUANT_BLOCKWISE, 128, 1, 0);
  EXPECT_EQ(p.m, M);
  EXPECT_EQ(p.k, K);
  EXPECT_TRUE(p.row && p.col && p.col_transposed);
  EXPECT_EQ(p.block, 128);
  EXPECT_FALSE(p.fp4());
}

TEST(QuantProblem, TwoDimensionalBlocksShareTransposedScales) {
  const pt_tensor x = tensor(PT_FLOAT16, {M, K});
  pt_tensor q_row = tensor(PT_FLOAT8_E5M2, {M, K}), s_row = tensor(PT_FLOAT32, {3, 2});
  pt_tensor q_col = tensor(PT_FLOAT8_E5M2, {K, M}), s_col = tensor(PT_FLOAT32, {2, 3});
  EXPECT_TRUE(make_quant_problem(&x, &q_row, &s_row, &q_col, &s_col, PT_QUANT_BLOCKWISE, 128, 1,
                                 PT_QUANT_2D_BLOCK)
                  .block_2d);
  pt_tensor bad = tensor(PT_FLOAT32, {3, 2});
  EXPECT_THAT(error_of([&] {
                make_quant_problem(&x, &q_row, &s_row, &q_col, &bad, PT_QUANT_BLOCKWISE, 128, 1, PT_QUANT_2D_BLOCK);
              }).what(),
              HasSubstr("argument 's_col' has shape [3, 2]; expected [2, 3]"));
}

TEST(QuantProblem, StackOfMatricesTransposesEachOne) {
  const pt_tensor x = tensor(PT_BFLOAT16, {3, 256, 200});
  pt_tensor q_row = tensor(PT_FLOAT8_E4M3, {3, 256, 200}), s_row = tensor(PT_FLOAT32, {3, 2, 2});
  pt_tensor q_col = tensor(PT_FLOAT8_E4M3, {3, 200, 256}), s_col = tensor(PT_FLOAT32, {3, 2, 2});
  const auto p =
      make_quant_problem(&x, &q_row, &s_row, &q_col, &s_col, PT_QUANT_BLOCKWISE, 128, 1, PT_QUANT_2D_BLOCK);
  EXPECT_EQ(p.m, 3 * 256);
  EXPECT_EQ(p.k, 200);
  EXPECT_EQ(p.col_rows, 256);
  pt_tensor s_one = tensor(PT_FLOAT32, {1});
  EXPECT_EQ(make_quant_problem(&x, nullptr, nullptr, &q_col, &s_one, PT_QUANT_TENSORWISE, 0, 1, 0).col_rows, 256);
  pt_tensor flat = tensor(PT_FLOAT8_E4M3, {200, 768});
  EXPECT_THAT(error_of([&] {
                make_quant_problem(&x, nullptr, nullptr, &flat, &s_col, PT_QUANT_BLOCKWISE, 128, 1, PT_QUANT_2D_BLOCK);
              }).what(),
              HasSubstr("argument 'q_col' has shape [200, 768]; expected [3, 200, 256]"));
  const pt_tensor odd = tensor(PT_BFLOAT16, {3, 200, 256});
  EXPECT_THAT(error_of([&] {
                make_quant_problem(&odd, nullptr, nullptr, &q_col, &s_one, PT_QUANT_TENSORWISE, 0, 1, 0);
              }).what(),
              HasSubstr("m % 128 == 0"));
  EXPECT_THAT(error_of([&] {
                make_quant_problem(&x, &q_row, &s_row, nullptr, nullptr, PT_QUANT_BLOCKWISE, 64, 1, 0);
              }).what(),
              HasSubstr("TENSORWISE, ROWWISE or BLOCKWISE with 128-element blocks"));
}

TEST(QuantProblem, RowwiseStackScalesEachMatrixColumn) {
  // One scale per row of the stack (3 * 256) and per column of each matrix (3 * 200); the amax
  // scratch holds both.
  const pt_tensor x = tensor(PT_BFLOAT16, {3, 256, 200});
  pt_tensor q_row = tensor(PT_FLOAT8_E4M3, {3, 256, 200}), s_row = tensor(PT_FLOAT32, {3, 256, 1});
  pt_tensor q_col = tensor(PT_FLOAT8_E4M3, {3, 200, 256}), s_col = tensor(PT_FLOAT32, {3, 200, 1});
  const auto p = make_quant_problem(&x, &q_row, &s_row, &q_col, &s_col, PT_QUANT_ROWWISE, 0, 1, 0);
  EXPECT_EQ(p.col_rows, 256);
  EXPECT_EQ(workspace_bytes(p), workspace_bytes(3 * 256, 3 * 200, PT_QUANT_ROWWISE));
  EXPECT_EQ(workspace_bytes(p), sizeof(float) * (3 * 256 + 3 * 200));
  pt_tensor one_matrix = tensor(PT_FLOAT32, {200, 1});
  EXPECT_THAT(error_of([&] {
                make_quant_problem(&x, &q_row, &s_row, &q_col, &one_matrix, PT_QUANT_ROWWISE, 0, 1, 0);
              }).what(),
              HasSubstr("expected 600 (one scale per column of each matrix)"));
  pt_tensor per_matrix = tensor(PT_FLOAT32, {3, 1});
  EXPECT_THAT(error_of([&] {
                make_quant_problem(&x, &q_row, &per_matrix, nullptr, nullptr, PT_QUANT_ROWWISE, 0, 1, 0);
              }).what(),
              HasSubstr("expected 768 (one scale per row)"));
}

TEST(QuantProblem, Fp4PacksAlongTheQuantizedDim) {
  const pt_tensor x = tensor(PT_BFLOAT16, {M, K});
  pt_tensor q = tensor(PT_UINT8, {K, M / 2}), s = tensor(PT_FLOAT8_E8M0, {K, 10});
  const auto p = make_quant_problem(&x, nullptr, nullptr, &q, &s, PT_QUANT_MX_BLOCKWISE, 32, 1, PT_QUANT_SR);
  EXPECT_TRUE(p.fp4() && p.sr && !p.row);
  const pt_tensor odd = tensor(PT_BFLOAT16, {M + 1, K});
  pt_tensor q_odd = tensor(PT_UINT8, {K, (M + 1) / 2});
  EXPECT_THAT(error_of([&] {
                make_quant_problem(&odd, nullptr, nullptr, &q_odd, &s, PT_QUANT_MX_BLOCKWISE, 32, 1, 0);
              }).what(),
              HasSubstr("must be even"));
}

TEST(QuantProblem, Errors) {
  const pt_tensor x = tensor(PT_BFLOAT16, {M, K});
  pt_tensor q = tensor(PT_FLOAT8_E4M3, {M, K}), s = tensor(PT_FLOAT32, {M, 1});
  EXPECT_EQ(error_of([&] { make_quant_problem(&x, nullptr, nullptr, nullptr, nullptr, 1, 0, 0, 0); }).status(),
            PT_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(error_of([&] { make_quant_problem(&x, &q, &s, nullptr, nullptr, PT_QUANT_BLOCKWISE, 96, 0, 0); }).what(),
              HasSubstr("BLOCKWISE supports 32, 64 or 128"));
  EXPECT_THAT(error_of([&] { make_quant_problem(&x, &q, &s, nullptr, nullptr, PT_QUANT_ROWWISE, 0, 0, PT_QUANT_RHT); })
                  .what(),
              HasSubstr("FP4 options"));
  pt_tensor s_mx = tensor(PT_FLOAT32, {M, 7});
  EXPECT_THAT(error_of([&] { make_quant_problem(&x, &q, &s_mx, nullptr, nullptr, PT_QUANT_MX_BLOCKWISE, 32, 0, 0); })
                  .what(),
              HasSubstr("float8_e8m0fnu"));
}

TEST(DequantProblem, ScaleLayouts) {
  const pt_tensor q = tensor(PT_FLOAT8_E4M3, {M, K}), out = tensor(PT_FLOAT32, {M, K});
  const pt_tensor s_rows = tensor(PT_FLOAT32, {M, 2}), s_cols = tensor(PT_FLOAT32, {3, K});
  auto p = make_dequant_problem(&q, &s_rows, &out, PT_QUANT_BLOCKWISE, 128, -1, 0);
  EXPECT_EQ(p.block_m, 1);
  EXPECT_EQ(p.block_k, 128);
  EXPECT_EQ(p.ld_s, 2);
  p = make_dequant_problem(&q, &s_cols, &out, PT_QUANT_BLOCKWISE, 128, 0, 0);
  EXPECT_EQ(p.block_m, 128);
  EXPECT_EQ(p.block_k, 1);
  EXPECT_EQ(p.ld_s, K);
  const pt_tensor one = tensor(PT_FLOAT32, {});
  p = make_dequant_problem(&q, &one, &out, PT_QUANT_TENSORWISE, 0, -1, 0);
  EXPECT_EQ(p.ld_s, 0);
  EXPECT_THAT(error_of([&] { make_dequant_problem(&q, &s_cols, &out, PT_QUANT_BLOCKWISE, 128, -1, 0); }).what(),
              HasSubstr("argument 'scale_inv' has shape [3, 200]; expected [300, 2]"));
}

}  // namespace
