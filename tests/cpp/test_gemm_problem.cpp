// make_problem: sizes, K-major flags and leading dimensions for every transpose/storage
// combination, and the argument errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ops/gemm/gemm_problem.h"
#include "test_util.h"

namespace {

using primus_turbo::gemm::make_problem;
using primus_turbo::gemm::Operand;
using primus_turbo::gemm::Problem;
using pt_test::error_of;
using ::testing::HasSubstr;

alignas(64) unsigned char g_a[1 << 14];
alignas(64) unsigned char g_b[1 << 14];
alignas(64) unsigned char g_d[1 << 14];

// Distinct sizes so that a swapped dimension cannot go unnoticed.
constexpr int64_t M = 3, N = 5, K = 7;
constexpr int64_t kPad = 4;  // leading dimensions are padded so ld is never just a size

pt_tensor matrix(void* data, int32_t dtype, int64_t rows, int64_t cols, bool row_major) {
  pt_tensor t{};
  t.data = data;
  t.dtype = dtype;
  t.ndim = 2;
  t.shape[0] = rows;
  t.shape[1] = cols;
  t.strides[0] = row_major ? cols + kPad : 1;
  t.strides[1] = row_major ? 1 : rows + kPad;
  return t;
}

pt_tensor out_matrix(int32_t dtype, int64_t rows, int64_t cols) {
  return matrix(g_d, dtype, rows, cols, true);
}

// Offset of op(A)(m, k) / op(B)(k, n) according to the canonical operand description.
int64_t a_offset(const Operand& a, int64_t m, int64_t k) {
  return a.k_major ? m * a.ld + k : k * a.ld + m;
}
int64_t b_offset(const Operand& b, int64_t k, int64_t n) {
  return b.k_major ? n * b.ld + k : k * b.ld + n;
}
// The same element according to the tensor's own strides.
int64_t stored_offset(const pt_tensor& t, bool trans, int64_t i, int64_t j) {
  return trans ? j * t.strides[0] + i * t.strides[1] : i * t.strides[0] + j * t.strides[1];
}

TEST(MakeProblem, AllTransposeAndStorageCombinations) {
  for (bool trans_a : {false, true}) {
    for (bool trans_b : {false, true}) {
      for (bool a_row : {false, true}) {
        for (bool b_row : {false, true}) {
          SCOPED_TRACE(testing::Message() << "trans_a=" << trans_a << " trans_b=" << trans_b
                                          << " a_row_major=" << a_row << " b_row_major=" << b_row);
          const pt_tensor a = trans_a ? matrix(g_a, PT_BFLOAT16, K, M, a_row)
                                      : matrix(g_a, PT_BFLOAT16, M, K, a_row);
          const pt_tensor b = trans_b ? matrix(g_b, PT_BFLOAT16, N, K, b_row)
                                      : matrix(g_b, PT_BFLOAT16, K, N, b_row);
          const pt_tensor d = out_matrix(PT_BFLOAT16, M, N);
          const Problem p = make_problem(&a, &b, &d, trans_a, trans_b, 2.0f, 0.5f);

          EXPECT_EQ(p.m, M);
          EXPECT_EQ(p.n, N);
          EXPECT_EQ(p.k, K);
          // K is contiguous in A when its stored last dim is K and A is row-major, or the
          // stored first dim is K and A is column-major; likewise for B.
          EXPECT_EQ(p.a.k_major, a_row != trans_a);
          EXPECT_EQ(p.b.k_major, b_row == trans_b);
          EXPECT_EQ(p.a.ptr, g_a);
          EXPECT_EQ(p.b.ptr, g_b);
          EXPECT_EQ(p.d, static_cast<void*>(g_d));
          EXPECT_EQ(p.ldd, N + kPad);
          EXPECT_EQ(p.alpha, 2.0f);
          EXPECT_EQ(p.beta, 0.5f);
          EXPECT_TRUE(p.accumulate());
          // Every element is found at the same place through the canonical description.
          for (int64_t m = 0; m < M; ++m) {
            for (int64_t k = 0; k < K; ++k) {
              ASSERT_EQ(a_offset(p.a, m, k), stored_offset(a, trans_a, m, k)) << m << "," << k;
            }
          }
          for (int64_t k = 0; k < K; ++k) {
            for (int64_t n = 0; n < N; ++n) {
              ASSERT_EQ(b_offset(p.b, k, n), stored_offset(b, trans_b, k, n)) << k << "," << n;
            }
          }
        }
      }
    }
  }
}

TEST(MakeProblem, LayoutCodeNamesTheContiguousDimensions) {
  const pt_tensor d = out_matrix(PT_BFLOAT16, M, N);
  const pt_tensor a_mk = matrix(g_a, PT_BFLOAT16, M, K, true);
  const pt_tensor a_km = matrix(g_a, PT_BFLOAT16, K, M, true);
  const pt_tensor b_kn = matrix(g_b, PT_BFLOAT16, K, N, true);
  const pt_tensor b_nk = matrix(g_b, PT_BFLOAT16, N, K, true);
  EXPECT_EQ(make_problem(&a_mk, &b_kn, &d, false, false, 1, 0).layout_code(), "AkBn");
  EXPECT_EQ(make_problem(&a_mk, &b_nk, &d, false, true, 1, 0).layout_code(), "AkBk");
  EXPECT_EQ(make_problem(&a_km, &b_kn, &d, true, false, 1, 0).layout_code(), "AmBn");
  EXPECT_EQ(make_problem(&a_km, &b_nk, &d, true, true, 1, 0).layout_code(), "AmBk");
}

TEST(MakeProblem, MismatchedInnerDimensionsNameBothShapes) {
  const pt_tensor a = matrix(g_a, PT_BFLOAT16, 3, 7, true);
  const pt_tensor b = matrix(g_b, PT_BFLOAT16, 6, 5, true);
  const pt_tensor d = out_matrix(PT_BFLOAT16, 3, 5);
  const auto e = error_of([&] { make_problem(&a, &b, &d, false, false, 1, 0); });
  EXPECT_EQ(e.status(), PT_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(e.what(), HasSubstr("inner dimensions do not match"));
  EXPECT_THAT(e.what(), HasSubstr("a [3, 7]"));
  EXPECT_THAT(e.what(), HasSubstr("b [6, 5]"));
}

TEST(MakeProblem, WrongOutputShapeIsRejected) {
  const pt_tensor a = matrix(g_a, PT_BFLOAT16, M, K, true);
  const pt_tensor b = matrix(g_b, PT_BFLOAT16, K, N, true);
  const pt_tensor d = out_matrix(PT_BFLOAT16, N, M);
  const auto e = error_of([&] { make_problem(&a, &b, &d, false, false, 1, 0); });
  EXPECT_EQ(e.status(), PT_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(e.what(), HasSubstr("argument 'out' has shape [5, 3]; expected [3, 5]"));
}

TEST(MakeProblem, ColumnMajorOutputIsRejected) {
  const pt_tensor a = matrix(g_a, PT_BFLOAT16, M, K, true);
  const pt_tensor b = matrix(g_b, PT_BFLOAT16, K, N, true);
  const pt_tensor d = matrix(g_d, PT_BFLOAT16, M, N, false);
  const auto e = error_of([&] { make_problem(&a, &b, &d, false, false, 1, 0); });
  EXPECT_EQ(e.status(), PT_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(e.what(), HasSubstr("argument 'out' must be row-major"));
}

TEST(MakeProblem, InputDtypesMustMatch) {
  const pt_tensor a = matrix(g_a, PT_BFLOAT16, M, K, true);
  const pt_tensor b = matrix(g_b, PT_FLOAT16, K, N, true);
  const pt_tensor d = out_matrix(PT_BFLOAT16, M, N);
  const auto e = error_of([&] { make_problem(&a, &b, &d, false, false, 1, 0); });
  EXPECT_EQ(e.status(), PT_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(e.what(), HasSubstr("argument 'b' has dtype float16"));
  EXPECT_THAT(e.what(), HasSubstr("same dtype as 'a' (bfloat16)"));
}

TEST(MakeProblem, Float32InputsNeedFloat32Output) {
  const pt_tensor a = matrix(g_a, PT_FLOAT32, M, K, true);
  const pt_tensor b = matrix(g_b, PT_FLOAT32, K, N, true);
  const pt_tensor d_bf16 = out_matrix(PT_BFLOAT16, M, N);
  const auto e = error_of([&] { make_problem(&a, &b, &d_bf16, false, false, 1, 0); });
  EXPECT_EQ(e.status(), PT_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(e.what(), HasSubstr("output dtype bfloat16 is not supported for float32 inputs"));

  const pt_tensor d_fp32 = out_matrix(PT_FLOAT32, M, N);
  const Problem p = make_problem(&a, &b, &d_fp32, false, false, 1, 0);
  EXPECT_EQ(p.ab_dtype, PT_FLOAT32);
  EXPECT_EQ(p.d_dtype, PT_FLOAT32);
}

TEST(MakeProblem, HalfInputsMayWriteFloat32) {
  const pt_tensor a = matrix(g_a, PT_BFLOAT16, M, K, true);
  const pt_tensor b = matrix(g_b, PT_BFLOAT16, K, N, true);
  const pt_tensor d = out_matrix(PT_FLOAT32, M, N);
  const Problem p = make_problem(&a, &b, &d, false, false, 1, 0);
  EXPECT_EQ(p.ab_dtype, PT_BFLOAT16);
  EXPECT_EQ(p.d_dtype, PT_FLOAT32);
  EXPECT_FALSE(p.accumulate());
}

TEST(MakeProblem, Float8InputsAreRejected) {
  const pt_tensor a = matrix(g_a, PT_FLOAT8_E4M3, M, K, true);
  const pt_tensor b = matrix(g_b, PT_FLOAT8_E4M3, K, N, true);
  const pt_tensor d = out_matrix(PT_BFLOAT16, M, N);
  const auto e = error_of([&] { make_problem(&a, &b, &d, false, false, 1, 0); });
  EXPECT_EQ(e.status(), PT_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(e.what(), HasSubstr("argument 'a' has dtype float8_e4m3fn"));
}

TEST(MakeProblem, Float8OutputIsRejected) {
  const pt_tensor a = matrix(g_a, PT_BFLOAT16, M, K, true);
  const pt_tensor b = matrix(g_b, PT_BFLOAT16, K, N, true);
  const pt_tensor d = out_matrix(PT_FLOAT8_E5M2, M, N);
  const auto e = error_of([&] { make_problem(&a, &b, &d, false, false, 1, 0); });
  EXPECT_EQ(e.status(), PT_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(e.what(), HasSubstr("output dtype float8_e5m2 is not supported"));
}

TEST(MakeProblem, AlignmentFlagsFollowPointerAndLeadingDimension) {
  // kPad keeps ld = K + 4 = 11 elements: not a multiple of 16 bytes for bf16.
  const pt_tensor a = matrix(g_a, PT_BFLOAT16, M, K, true);
  pt_tensor b = matrix(g_b, PT_BFLOAT16, K, N, true);
  b.strides[0] = 16;
  pt_tensor d = out_matrix(PT_BFLOAT16, M, N);
  d.strides[0] = 8;
  const Problem p = make_problem(&a, &b, &d, false, false, 1, 0);
  EXPECT_FALSE(p.a.aligned16);
  EXPECT_TRUE(p.b.aligned16);
  EXPECT_TRUE(p.d_aligned16);
}

}  // namespace

// GEMM plans: the same argument checks as pt_gemm, made once; an empty output needs no GPU.
namespace plan_tests {

TEST(GemmPlan, InvalidProblemIsAnErrorAndLeavesNoPlan) {
  const pt_tensor a = matrix(g_a, PT_BFLOAT16, 3, 7, true);
  const pt_tensor b = matrix(g_b, PT_BFLOAT16, 6, 5, true);
  const pt_tensor d = out_matrix(PT_BFLOAT16, 3, 5);
  pt_gemm_plan plan = reinterpret_cast<pt_gemm_plan>(0x1);
  EXPECT_EQ(pt_gemm_plan_create(&a, &b, &d, 0, 0, 1, 0, PT_BACKEND_CUBLASLT, -1, &plan),
            PT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(plan, nullptr);
  EXPECT_THAT(pt_last_error(), HasSubstr("inner dimensions do not match"));
}

TEST(GemmPlan, UnknownBackendIsRejected) {
  const pt_tensor a = matrix(g_a, PT_BFLOAT16, M, K, true);
  const pt_tensor b = matrix(g_b, PT_BFLOAT16, K, N, true);
  const pt_tensor d = out_matrix(PT_BFLOAT16, M, N);
  pt_gemm_plan plan = nullptr;
  EXPECT_EQ(pt_gemm_plan_create(&a, &b, &d, 0, 0, 1, 0, PT_BACKEND_NCCL, -1, &plan),
            PT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(plan, nullptr);
}

TEST(GemmPlan, EmptyOutputRunsAsNoOp) {
  const pt_tensor a = matrix(g_a, PT_BFLOAT16, 0, K, true);
  const pt_tensor b = matrix(g_b, PT_BFLOAT16, K, N, true);
  const pt_tensor d = out_matrix(PT_BFLOAT16, 0, N);
  pt_gemm_plan plan = nullptr;
  ASSERT_EQ(pt_gemm_plan_create(&a, &b, &d, 0, 0, 1, 0, PT_BACKEND_CUTLASS, -1, &plan),
            PT_SUCCESS);
  ASSERT_NE(plan, nullptr);
  EXPECT_EQ(pt_gemm_plan_needs_workspace(plan), 0);
  EXPECT_EQ(pt_gemm_plan_run(plan, g_a, g_b, g_d, nullptr, 0, nullptr), PT_SUCCESS);
  pt_gemm_plan_destroy(plan);
}

TEST(GemmPlan, NullPlanIsAnError) {
  EXPECT_EQ(pt_gemm_plan_run(nullptr, g_a, g_b, g_d, nullptr, 0, nullptr),
            PT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(pt_gemm_plan_create(nullptr, nullptr, nullptr, 0, 0, 1, 0, PT_BACKEND_CUBLASLT, -1,
                                nullptr),
            PT_ERROR_INVALID_ARGUMENT);
  pt_gemm_plan_destroy(nullptr);  // harmless
}

}  // namespace plan_tests
