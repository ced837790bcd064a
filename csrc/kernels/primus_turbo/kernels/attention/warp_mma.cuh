// Warp-level building blocks of the attention kernels: asynchronous tile copies into padded shared
// memory, and 16-row tile products on the m16n8k16 tensor-core instruction.
//
// Every tile in shared memory is row-major with a row pitch of (columns + 8) elements: the 16 bytes
// of padding put the 8 rows one ldmatrix reads in 8 different bank groups for every head dim we
// take (64, 96, 128, 192, 256), with no swizzle arithmetic.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>
#include <type_traits>

namespace primus_turbo::kernels::attention {

template <int kCols>
__host__ __device__ constexpr int pitch() { return kCols + 8; }

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared; zero-filled when !valid (src is then not read).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }
// Until at most kPending of the groups committed last are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Rows [0, kRows) x columns [0, kCols) of a global operand (row stride `stride` elements, unit
// column stride, 16-byte aligned rows) into a padded tile; rows >= valid_rows become zeros.
template <class T, int kRows, int kCols, int kThreads>
__device__ __forceinline__ void load_tile(T* tile, const T* src, int64_t stride, int valid_rows) {
  constexpr int kChunks = kCols * static_cast<int>(sizeof(T)) / 16;
  constexpr int kPerChunk = 16 / static_cast<int>(sizeof(T));
  for (int c = threadIdx.x; c < kRows * kChunks; c += kThreads) {
    const int r = c / kChunks, col = (c % kChunks) * kPerChunk;
    const bool valid = r < valid_rows;
    cp_async16(tile + r * pitch<kCols>() + col, valid ? src + r * stride + col : src, valid);
  }
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// d += a * b on one m16n8k16 tile, float accumulation.
template <class T>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t r;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    r = *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    r = *reinterpret_cast<uint32_t*>(&v);
  }
  return r;
}

// Accumulator fragments (c0..c3 per n8 tile: rows g and g + 8, columns 2c and 2c + 1 where
// g = lane / 4, c = lane % 4) of a tile 16 x (8 * kNT) float, as thread coordinates.
__device__ __forceinline__ int frag_row(int lane, int e) { return lane / 4 + (e >> 1) * 8; }
__device__ __forceinline__ int frag_col(int lane, int t, int e) { return t * 8 + (lane % 4) * 2 + (e & 1); }

template <int kNT>
__device__ __forceinline__ void zero(float (&acc)[kNT][4]) {
#pragma unroll
  for (int t = 0; t < kNT; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[t][e] = 0.f;
}

// The accumulators of a 16 x (8 * kNT) tile as the A operand (16 x K, K = 8 * kNT) of the next
// product: two adjacent n8 tiles make one k16 step, the layouts coincide register for register.
template <class T, int kNT>
__device__ __forceinline__ void acc_to_a(const float (&acc)[kNT][4], uint32_t (&a)[kNT / 2][4]) {
#pragma unroll
  for (int kk = 0; kk < kNT / 2; ++kk) {
    a[kk][0] = pack2<T>(acc[2 * kk][0], acc[2 * kk][1]);
    a[kk][1] = pack2<T>(acc[2 * kk][2], acc[2 * kk][3]);
    a[kk][2] = pack2<T>(acc[2 * kk + 1][0], acc[2 * kk + 1][1]);
    a[kk][3] = pack2<T>(acc[2 * kk + 1][2], acc[2 * kk + 1][3]);
  }
}

// acc (16kMT x 8kNT) += A (16kMT x kK, rows of a padded tile at a, pitch lda) * B^T, where B is
// 8kNT x kK (rows of a padded tile at b, pitch ldb): both operands K-contiguous. Each B fragment
// serves kMT row tiles, so a warp that owns more rows reads less shared memory per product.
template <class T, int kMT, int kNT, int kK>
__device__ __forceinline__ void gemm_ss(float (&acc)[kMT][kNT][4], const T* a, int lda, const T* b, int ldb,
                                        int lane) {
  static_assert(kNT % 2 == 0 && kK % 16 == 0, "tile sizes");
#pragma unroll
  for (int k0 = 0; k0 < kK; k0 += 16) {
    uint32_t af[kMT][4];
#pragma unroll
    for (int m = 0; m < kMT; ++m) ldmatrix_x4(af[m], a + (m * 16 + lane % 16) * lda + k0 + (lane / 16) * 8);
#pragma unroll
    for (int t = 0; t < kNT; t += 2) {
      uint32_t bf[4];
      ldmatrix_x4(bf, b + (t * 8 + (lane / 16) * 8 + lane % 8) * ldb + k0 + ((lane / 8) % 2) * 8);
#pragma unroll
      for (int m = 0; m < kMT; ++m) {
        mma16816<T>(acc[m][t], af[m], bf[0], bf[1]);
        mma16816<T>(acc[m][t + 1], af[m], bf[2], bf[3]);
      }
    }
  }
}

// One row tile (16 rows a warp).
template <class T, int kNT, int kK>
__device__ __forceinline__ void gemm_ss(float (&acc)[kNT][4], const T* a, int lda, const T* b, int ldb, int lane) {
  gemm_ss<T, 1, kNT, kK>(reinterpret_cast<float(&)[1][kNT][4]>(acc), a, lda, b, ldb, lane);
}

// acc (16kMT x 8kNT) += A (16kMT x kK, register fragments from acc_to_a) * B, where B is kK x 8kNT
// (rows of a padded tile at b, pitch ldb): N-contiguous, read transposed by ldmatrix.
template <class T, int kMT, int kNT, int kK>
__device__ __forceinline__ void gemm_rs(float (&acc)[kMT][kNT][4], const uint32_t (&a)[kMT][kK / 16][4], const T* b,
                                        int ldb, int lane) {
  static_assert(kNT % 2 == 0 && kK % 16 == 0, "tile sizes");
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) {
#pragma unroll
    for (int t = 0; t < kNT; t += 2) {
      uint32_t bf[4];
      ldmatrix_x4_trans(bf, b + (kk * 16 + lane % 8 + ((lane / 8) % 2) * 8) * ldb + t * 8 + (lane / 16) * 8);
#pragma unroll
      for (int m = 0; m < kMT; ++m) {
        mma16816<T>(acc[m][t], a[m][kk], bf[0], bf[1]);
        mma16816<T>(acc[m][t + 1], a[m][kk], bf[2], bf[3]);
      }
    }
  }
}

template <class T, int kNT, int kK>
__device__ __forceinline__ void gemm_rs(float (&acc)[kNT][4], const uint32_t (&a)[kK / 16][4], const T* b, int ldb,
                                        int lane) {
  gemm_rs<T, 1, kNT, kK>(reinterpret_cast<float(&)[1][kNT][4]>(acc),
                         reinterpret_cast<const uint32_t(&)[1][kK / 16][4]>(a), b, ldb, lane);
}

// Sum / max over the 4 threads that share a fragment row.
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

// Stores a 16 x 8kNT float tile (times `scale`) as T to rows [row0, row0 + 16) of dst (row
// stride `stride`), rows >= valid_rows skipped.
template <class T, int kNT>
__device__ __forceinline__ void store_rows(const float (&acc)[kNT][4], T* dst, int64_t stride, int row0,
                                           int valid_rows, float scale, int lane) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = row0 + lane / 4 + half * 8;
    if (r >= valid_rows) continue;
    T* row = dst + r * stride;
#pragma unroll
    for (int t = 0; t < kNT; ++t)
      *reinterpret_cast<uint32_t*>(row + t * 8 + (lane % 4) * 2) =
          pack2<T>(acc[t][2 * half] * scale, acc[t][2 * half + 1] * scale);
  }
}

}  // namespace primus_turbo::kernels::attention
