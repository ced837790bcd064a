// grouped_gemm::make_problem: the kernel's view of forward and wgrad calls (which tensor is the
// kernel's A and B, its fixed sizes and layout code), and the argument errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <initializer_list>
#include <string>

#include "ops/grouped_gemm/grouped_gemm_problem.h"
#include "test_util.h"

namespace {

using primus_turbo::grouped_gemm::make_problem;
using primus_turbo::grouped_gemm::Problem;
using pt_test::error_of;
using ::testing::HasSubstr;

alignas(64) unsigned char g_a[64], g_b[64], g_d[64], g_lens[64], g_offs[64];

// Distinct sizes so that a swapped dimension cannot go unnoticed.
constexpr int64_t G = 3, M = 40, N = 24, K = 16;

pt_tensor packed(void* data, int32_t dtype, std::initializer_list<int64_t> shape) {
  pt_tensor t{};
  t.data = data;
  t.dtype = dtype;
  t.ndim = static_cast<int32_t>(shape.size());
  int i = 0;
  for (int64_t s : shape) t.shape[i++] = s;
  int64_t stride = 1;
  for (int j = t.ndim - 1; j >= 0; --j) {
    t.strides[j] = stride;
    stride *= t.shape[j];
  }
  return t;
}

struct Call {
  pt_tensor a, b, lens, offs, d;
  pt_grouped_gemm_args args{};
  Call(bool wgrad, bool trans_b, bool with_offs = false) {
    a = packed(g_a, PT_BFLOAT16, {M, K});
    lens = packed(g_lens, PT_INT64, {G});
    offs = packed(g_offs, PT_INT64, {G + 1});
    if (!wgrad) {
      b = trans_b ? packed(g_b, PT_BFLOAT16, {G, N, K}) : packed(g_b, PT_BFLOAT16, {G, K, N});
      d = packed(g_d, PT_BFLOAT16, {M, N});
    } else {
      b = packed(g_b, PT_BFLOAT16, {M, N});
      d = trans_b ? packed(g_d, PT_BFLOAT16, {G, N, K}) : packed(g_d, PT_BFLOAT16, {G, K, N});
    }
    args = {&a, &b, &lens, with_offs ? &offs : nullptr, &d, wgrad, trans_b};
  }
};

TEST(GroupedGemmProblem, ForwardView) {
  for (bool trans_b : {false, true}) {
    Call c(false, trans_b);
    const Problem p = make_problem(&c.args);
    EXPECT_EQ(p.groups, G);
    EXPECT_EQ(p.rows, M);
    EXPECT_EQ(p.n, N);
    EXPECT_EQ(p.k, K);
    EXPECT_EQ(p.kernel_a(), g_a);
    EXPECT_EQ(p.kernel_b(), g_b);
    EXPECT_EQ(p.kernel_n(), N);
    EXPECT_EQ(p.kernel_k(), K);
    EXPECT_EQ(p.layout_code(), trans_b ? "AkBk" : "AkBn");
    EXPECT_TRUE(p.aligned16);
    EXPECT_EQ(p.group_offs, nullptr);
  }
}

TEST(GroupedGemmProblem, WgradView) {
  // d[g] = a_g^T grad_g: kernel A = a (M = K), B = grad (N).
  Call plain(true, false);
  Problem p = make_problem(&plain.args);
  EXPECT_EQ(p.kernel_a(), g_a);
  EXPECT_EQ(p.kernel_b(), g_b);
  EXPECT_EQ(p.kernel_m(), K);
  EXPECT_EQ(p.kernel_n(), N);
  EXPECT_EQ(p.layout_code(), "AmBn");
  // trans_b: d[g] = grad_g^T a_g, so the operands swap.
  Call trans(true, true, true);
  p = make_problem(&trans.args);
  EXPECT_EQ(p.kernel_a(), g_b);
  EXPECT_EQ(p.kernel_b(), g_a);
  EXPECT_EQ(p.kernel_m(), N);
  EXPECT_EQ(p.kernel_n(), K);
  EXPECT_EQ(p.group_offs, reinterpret_cast<const int64_t*>(g_offs));
}

TEST(GroupedGemmProblem, ArgumentErrors) {
  Call c(false, false);
  c.b.shape[0] = G + 1;
  EXPECT_THAT(std::string(error_of([&] { make_problem(&c.args); }).what()), HasSubstr("group_lens has 3"));
  Call d(false, false);
  d.lens.dtype = PT_INT32;
  EXPECT_THAT(std::string(error_of([&] { make_problem(&d.args); }).what()), HasSubstr("expected int64"));
  Call e(false, true);
  e.a.strides[0] = K + 8;
  EXPECT_THAT(std::string(error_of([&] { make_problem(&e.args); }).what()), HasSubstr("argument 'a' must be contiguous"));
  Call f(true, false, true);
  f.offs.shape[0] = G;
  EXPECT_THAT(std::string(error_of([&] { make_problem(&f.args); }).what()), HasSubstr("'group_offs' has shape"));
  Call g(true, true);
  g.d = packed(g_d, PT_BFLOAT16, {G, K, N});  // trans_b wants [G, N, K]
  EXPECT_THAT(std::string(error_of([&] { make_problem(&g.args); }).what()), HasSubstr("argument 'out' has shape"));
}

TEST(GroupedGemmProblem, SmBudgetIsWholeClusters) {
  Call c(false, false);
  EXPECT_EQ(make_problem(&c.args).sm_budget(132), 132);  // 0: every SM
  c.args.num_sms = 7;
  EXPECT_EQ(make_problem(&c.args).sm_budget(132), 6);  // whole 2-CTA clusters
  c.args.num_sms = 1;
  EXPECT_EQ(make_problem(&c.args).sm_budget(132), 2);
  c.args.num_sms = 500;
  EXPECT_EQ(make_problem(&c.args).sm_budget(132), 132);
  c.args.num_sms = -1;
  EXPECT_THAT(std::string(error_of([&] { make_problem(&c.args); }).what()), HasSubstr("num_sms must be >= 0"));
}

}  // namespace
