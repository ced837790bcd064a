// as_matrix: how a 2-D pt_tensor is read as a row- or column-major matrix, and what it rejects.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <initializer_list>

#include "core/tensor.h"
#include "test_util.h"

namespace {

using primus_turbo::as_matrix;
using primus_turbo::is_aligned16;
using primus_turbo::Matrix2D;
using pt_test::error_of;
using ::testing::HasSubstr;

alignas(64) unsigned char g_storage[4096];

pt_tensor make_tensor(std::initializer_list<int64_t> shape, std::initializer_list<int64_t> strides,
                      int32_t dtype = PT_BFLOAT16, void* data = g_storage) {
  pt_tensor t{};
  t.data = data;
  t.dtype = dtype;
  t.ndim = static_cast<int32_t>(shape.size());
  int i = 0;
  for (int64_t s : shape) t.shape[i++] = s;
  i = 0;
  for (int64_t s : strides) t.strides[i++] = s;
  return t;
}

TEST(AsMatrix, RowMajorContiguous) {
  const pt_tensor t = make_tensor({3, 5}, {5, 1});
  const Matrix2D m = as_matrix(&t, "a");
  EXPECT_EQ(m.t, &t);
  EXPECT_EQ(m.rows, 3);
  EXPECT_EQ(m.cols, 5);
  EXPECT_TRUE(m.row_major);
  EXPECT_EQ(m.ld, 5);
}

TEST(AsMatrix, TransposedViewIsColumnMajor) {
  // The transpose of a contiguous [3, 5] tensor.
  const pt_tensor t = make_tensor({5, 3}, {1, 5});
  const Matrix2D m = as_matrix(&t, "a");
  EXPECT_EQ(m.rows, 5);
  EXPECT_EQ(m.cols, 3);
  EXPECT_FALSE(m.row_major);
  EXPECT_EQ(m.ld, 5);
}

TEST(AsMatrix, SlicedViewsKeepTheParentsLeadingDimension) {
  const pt_tensor rows = make_tensor({4, 3}, {8, 1});  // x[:, :3] of a [4, 8] tensor
  const Matrix2D mr = as_matrix(&rows, "a");
  EXPECT_TRUE(mr.row_major);
  EXPECT_EQ(mr.ld, 8);

  const pt_tensor cols = make_tensor({3, 4}, {1, 8});  // x[:, :3].t()
  const Matrix2D mc = as_matrix(&cols, "a");
  EXPECT_FALSE(mc.row_major);
  EXPECT_EQ(mc.ld, 8);
}

TEST(AsMatrix, SingleRowAcceptsAnyStrideOnTheSizeOneDimension) {
  const pt_tensor padded = make_tensor({1, 4}, {7, 1});
  const Matrix2D a = as_matrix(&padded, "a");
  EXPECT_TRUE(a.row_major);
  EXPECT_EQ(a.ld, 7);

  // PyTorch gives size-1 dimensions arbitrary strides; ld never drops below the row length.
  const pt_tensor small = make_tensor({1, 4}, {1, 1});
  const Matrix2D b = as_matrix(&small, "a");
  EXPECT_TRUE(b.row_major);
  EXPECT_EQ(b.ld, 4);

  const pt_tensor zero = make_tensor({1, 4}, {0, 1});
  EXPECT_EQ(as_matrix(&zero, "a").ld, 4);

  // A strided single row: each element is its own column of a column-major matrix with ld 3.
  const pt_tensor strided = make_tensor({1, 4}, {7, 3});
  const Matrix2D c = as_matrix(&strided, "a");
  EXPECT_FALSE(c.row_major);
  EXPECT_EQ(c.ld, 3);
}

TEST(AsMatrix, SingleColumnAcceptsAnyStrideOnTheSizeOneDimension) {
  const pt_tensor contiguous = make_tensor({4, 1}, {1, 1});
  const Matrix2D a = as_matrix(&contiguous, "a");
  EXPECT_TRUE(a.row_major);
  EXPECT_EQ(a.ld, 1);

  const pt_tensor odd = make_tensor({4, 1}, {1, 99});
  const Matrix2D b = as_matrix(&odd, "a");
  EXPECT_EQ(b.ld, 1);

  // Element (i, 0) sits at i * 3: row-major with ld 3.
  const pt_tensor strided = make_tensor({4, 1}, {3, 7});
  const Matrix2D c = as_matrix(&strided, "a");
  EXPECT_TRUE(c.row_major);
  EXPECT_EQ(c.ld, 3);
}

TEST(AsMatrix, SingleElementAcceptsAnyStrides) {
  const pt_tensor odd = make_tensor({1, 1}, {9, 9});
  EXPECT_GE(as_matrix(&odd, "a").ld, 1);
  // What torch.tensor(x).expand(1, 1) looks like; PyTorch calls it contiguous, so .contiguous()
  // would not change it and it must be accepted.
  const pt_tensor expanded = make_tensor({1, 1}, {0, 0});
  EXPECT_GE(as_matrix(&expanded, "a").ld, 1);
}

TEST(AsMatrix, NoUnitStrideIsRejectedNamingTheArgument) {
  const pt_tensor t = make_tensor({3, 4}, {8, 2});
  const auto e = error_of([&] { as_matrix(&t, "weight"); });
  EXPECT_EQ(e.status(), PT_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(e.what(), HasSubstr("argument 'weight'"));
  EXPECT_THAT(e.what(), HasSubstr("[3, 4]"));
  EXPECT_THAT(e.what(), HasSubstr("strides [8, 2]"));
  EXPECT_THAT(e.what(), HasSubstr("no unit stride"));
}

TEST(AsMatrix, LeadingDimensionSmallerThanRowIsRejected) {
  const pt_tensor t = make_tensor({3, 4}, {2, 1});  // rows would overlap
  const auto e = error_of([&] { as_matrix(&t, "a"); });
  EXPECT_EQ(e.status(), PT_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(e.what(), HasSubstr("leading dimension 2"));
}

TEST(AsMatrix, NegativeDimensionIsRejected) {
  const pt_tensor t = make_tensor({-1, 4}, {4, 1});
  const auto e = error_of([&] { as_matrix(&t, "b"); });
  EXPECT_EQ(e.status(), PT_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(e.what(), HasSubstr("argument 'b' has a negative dimension [-1, 4]"));
}

TEST(AsMatrix, NullTensorIsRejected) {
  const auto e = error_of([&] { as_matrix(nullptr, "b"); });
  EXPECT_EQ(e.status(), PT_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(e.what(), HasSubstr("argument 'b' is null"));
}

TEST(AsMatrix, NullDataIsRejectedUnlessEmpty) {
  const pt_tensor t = make_tensor({2, 2}, {2, 1}, PT_BFLOAT16, nullptr);
  const auto e = error_of([&] { as_matrix(&t, "a"); });
  EXPECT_EQ(e.status(), PT_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(e.what(), HasSubstr("argument 'a' has a null data pointer"));

  const pt_tensor empty = make_tensor({0, 2}, {2, 1}, PT_BFLOAT16, nullptr);
  const Matrix2D m = as_matrix(&empty, "a");
  EXPECT_EQ(m.rows, 0);
  EXPECT_EQ(m.cols, 2);
}

TEST(AsMatrix, WrongRankIsRejected) {
  const pt_tensor t3 = make_tensor({2, 3, 4}, {12, 4, 1});
  const auto e = error_of([&] { as_matrix(&t3, "a"); });
  EXPECT_EQ(e.status(), PT_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(e.what(), HasSubstr("argument 'a' must be 2-D, got 3-D with shape [2, 3, 4]"));

  const pt_tensor t1 = make_tensor({5}, {1});
  EXPECT_THAT(error_of([&] { as_matrix(&t1, "a"); }).what(), HasSubstr("got 1-D"));
}

TEST(AsMatrix, UnknownDtypeIsRejected) {
  const pt_tensor t = make_tensor({2, 2}, {2, 1}, 42);
  const auto e = error_of([&] { as_matrix(&t, "a"); });
  EXPECT_EQ(e.status(), PT_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(e.what(), HasSubstr("unknown dtype code 42"));
}

TEST(IsAligned16, NeedsAlignedPointerAndLeadingDimensionInBytes) {
  const pt_tensor bf16_ld8 = make_tensor({2, 8}, {8, 1}, PT_BFLOAT16);
  EXPECT_TRUE(is_aligned16(as_matrix(&bf16_ld8, "a")));  // 8 * 2 bytes

  const pt_tensor bf16_ld4 = make_tensor({2, 4}, {4, 1}, PT_BFLOAT16);
  EXPECT_FALSE(is_aligned16(as_matrix(&bf16_ld4, "a")));  // 8 bytes

  const pt_tensor fp32_ld4 = make_tensor({2, 4}, {4, 1}, PT_FLOAT32);
  EXPECT_TRUE(is_aligned16(as_matrix(&fp32_ld4, "a")));

  const pt_tensor fp8_ld8 = make_tensor({2, 8}, {8, 1}, PT_FLOAT8_E4M3);
  EXPECT_FALSE(is_aligned16(as_matrix(&fp8_ld8, "a")));
  const pt_tensor fp8_ld16 = make_tensor({2, 8}, {16, 1}, PT_FLOAT8_E4M3);
  EXPECT_TRUE(is_aligned16(as_matrix(&fp8_ld16, "a")));

  const pt_tensor col_major = make_tensor({8, 2}, {1, 8}, PT_BFLOAT16);
  EXPECT_TRUE(is_aligned16(as_matrix(&col_major, "a")));

  const pt_tensor offset = make_tensor({2, 8}, {8, 1}, PT_BFLOAT16, g_storage + 2);
  EXPECT_FALSE(is_aligned16(as_matrix(&offset, "a")));
}

}  // namespace
