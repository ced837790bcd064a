// Compares the FP8 quantization kernels that serve the same request (shared-memory tile, row walk,
// register tile) byte for byte on every output and scale, and times each against a copy of the
// same bytes. Built and run by hand on a machine with a GPU:
//
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I csrc/kernels \
//        tools/quant_kernel_probe.cu -o /tmp/quant_kernel_probe && /tmp/quant_kernel_probe
//
// --small: the odd shapes only (no timing), e.g. under compute-sanitizer (memcheck, racecheck).
//
// Exit status 1 if any pair of kernels disagrees.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "primus_turbo/kernels/quantization/quantize_rows.cuh"
#include "primus_turbo/kernels/quantization/quantize_tile.cuh"
#include "primus_turbo/kernels/quantization/quantize_tile_regs.cuh"

using namespace primus_turbo::kernels;
using namespace primus_turbo::kernels::quant;

#define CHECK(x)                                                                              \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(2);                                                                           \
    }                                                                                         \
  } while (0)

template <class T>
__global__ void fill_random(T* x, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float u = hash_uniform(seed, static_cast<uint64_t>(i)), v = hash_uniform(seed + 1, static_cast<uint64_t>(i));
    // Rows and columns of different magnitude, so each block gets its own scale.
    x[i] = from_float<T>((u - 0.5f) * 8.0f * (1.0f + 3.0f * v * v));
  }
}

__global__ void copy_kernel(const uint4* __restrict__ a, uint4* __restrict__ b, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    b[i] = a[i];
}

struct Buffers {
  void *q_row, *s_row, *q_col, *s_col;
  size_t q_bytes, s_row_bytes, s_col_bytes;
};

Buffers alloc(int64_t m, int64_t k) {
  Buffers b{};
  b.q_bytes = m * k;
  b.s_row_bytes = sizeof(float) * (m + 4) * ((k + 127) / 128 + 4);
  b.s_col_bytes = sizeof(float) * (k + 4) * ((m + 127) / 128 + 4);
  CHECK(cudaMalloc(&b.q_row, b.q_bytes));
  CHECK(cudaMalloc(&b.q_col, b.q_bytes));
  CHECK(cudaMalloc(&b.s_row, b.s_row_bytes));
  CHECK(cudaMalloc(&b.s_col, b.s_col_bytes));
  return b;
}

void release(const Buffers& b) {
  for (void* p : {b.q_row, b.q_col, b.s_row, b.s_col}) CHECK(cudaFree(p));
}

void poison(const Buffers& b) {
  CHECK(cudaMemset(b.q_row, 0xab, b.q_bytes));
  CHECK(cudaMemset(b.q_col, 0xab, b.q_bytes));
  CHECK(cudaMemset(b.s_row, 0xab, b.s_row_bytes));
  CHECK(cudaMemset(b.s_col, 0xab, b.s_col_bytes));
}

std::vector<uint8_t> host(const void* p, size_t n) {
  std::vector<uint8_t> h(n);
  CHECK(cudaMemcpy(h.data(), p, n, cudaMemcpyDeviceToHost));
  return h;
}

PtQuantParams with_buffers(PtQuantParams p, const Buffers& b) {
  if (p.q_row) p.q_row = b.q_row, p.s_row = b.s_row;
  if (p.q_col) p.q_col = b.q_col, p.s_col = b.s_col;
  return p;
}

using Launch = std::function<void(const PtQuantParams&)>;

template <class T, class F>
Launch smem_tile() {
  return [](const PtQuantParams& p) {
    constexpr size_t bytes = tile_smem_bytes<T>();
    static bool opted = false;
    if (!opted)
      CHECK(cudaFuncSetAttribute(quantize_tile_kernel<T, F, T>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    opted = true;
    const dim3 grid((p.m + kTile - 1) / kTile, (p.k + kTile - 1) / kTile);
    quantize_tile_kernel<T, F, T><<<grid, kThreads, bytes>>>(p);
  };
}

template <class T, class F>
Launch row_walk(int num_sms) {
  return [num_sms](const PtQuantParams& p) {
    const int64_t chunks = p.m * ((p.k + kRowChunk - 1) / kRowChunk);
    const int64_t grid = std::min<int64_t>((chunks + 8 * kRowUnroll - 1) / (8 * kRowUnroll), int64_t{num_sms} * 8);
    quantize_rows_kernel<T, F><<<static_cast<unsigned>(grid), kRowThreads>>>(p);
  };
}

template <class T, class F>
Launch rowwise_l2(int num_sms) {
  return [num_sms](const PtQuantParams& p) {
    const int64_t grid = std::min<int64_t>(p.m, int64_t{num_sms} * 16);
    quantize_rowwise_kernel<T, F><<<static_cast<unsigned>(grid), kRowThreads>>>(p);
  };
}

template <class T, class F>
Launch rowwise_regs() {
  return [](const PtQuantParams& p) {
    if (!launch_rowwise_regs<T, F>(p, nullptr)) {
      std::fprintf(stderr, "rowwise registers: request not supported\n");
      std::exit(2);
    }
  };
}

template <class T, class F>
Launch regs_tile() {
  return [](const PtQuantParams& p) {
    if (!tile_regs_supported(p, sizeof(T), F::kFp4)) {
      std::fprintf(stderr, "register tile: request not supported\n");
      std::exit(2);
    }
    if (!launch_tile_regs<T, F>(p, nullptr)) {
      std::fprintf(stderr, "register tile: grid too large\n");
      std::exit(2);
    }
  };
}

float time_us(const Launch& f, const PtQuantParams& p, int reps) {
  f(p);
  CHECK(cudaDeviceSynchronize());
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  CHECK(cudaEventRecord(a));
  for (int i = 0; i < reps; ++i) f(p);
  CHECK(cudaEventRecord(b));
  CHECK(cudaEventSynchronize(b));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, a, b));
  CHECK(cudaGetLastError());
  return 1000.0f * ms / reps;
}

int failures = 0;

// Runs each launcher on p, checks all agree with the first, prints their times.
void compare(const char* name, PtQuantParams p, const std::vector<std::pair<const char*, Launch>>& impls, Buffers& ref,
             Buffers& out, double bytes, double copy_gbps, bool timing) {
  std::vector<std::vector<uint8_t>> first;
  for (size_t i = 0; i < impls.size(); ++i) {
    Buffers& b = i == 0 ? ref : out;
    poison(b);
    const PtQuantParams q = with_buffers(p, b);
    impls[i].second(q);
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaGetLastError());
    std::vector<std::vector<uint8_t>> got;
    if (p.q_row) got.push_back(host(b.q_row, b.q_bytes)), got.push_back(host(b.s_row, b.s_row_bytes));
    if (p.q_col) got.push_back(host(b.q_col, b.q_bytes)), got.push_back(host(b.s_col, b.s_col_bytes));
    if (i == 0) {
      first = std::move(got);
      continue;
    }
    for (size_t j = 0; j < got.size(); ++j) {
      if (got[j] != first[j]) {
        size_t at = 0;
        while (got[j][at] == first[j][at]) ++at;
        std::printf("MISMATCH %s [%lld x %lld]: %s buffer %zu differs from %s at byte %zu (%02x vs %02x)\n", name,
                    (long long)p.m, (long long)p.k, impls[i].first, j, impls[0].first, at, got[j][at], first[j][at]);
        ++failures;
        break;
      }
    }
  }
  if (!timing) {
    std::printf("%-34s [%6lld x %6lld]  outputs identical across %zu kernels\n", name, (long long)p.m, (long long)p.k,
                impls.size());
    return;
  }
  for (auto& [impl, f] : impls) {
    const float us = time_us(f, with_buffers(p, out), 20);
    const double gbps = bytes / us / 1e3;
    std::printf("%-34s [%6lld x %6lld]  %-12s %8.1f us  %6.0f GB/s  %.2f of copy\n", name, (long long)p.m,
                (long long)p.k, impl, us, gbps, gbps / copy_gbps);
  }
}

// The amax kernels: the tensor's (the row walk or the register tile), and per row and column with
// the tensor's (the shared-memory tile or the register tile).
template <class T>
void compare_amax(int64_t m, int64_t k, const T* x, int num_sms, bool timing, double copy_gbps, const char* tag) {
  float* buf;
  const size_t n = 1 + m + k;
  CHECK(cudaMalloc(&buf, sizeof(float) * n));
  const auto walk = [&](const PtQuantAmaxParams& a) {
    const int64_t chunks = a.m * ((a.k + kRowChunk - 1) / kRowChunk);
    const int64_t grid = std::min<int64_t>((chunks + 8 * kRowUnroll - 1) / (8 * kRowUnroll), int64_t{num_sms} * 8);
    amax_rows_kernel<T><<<static_cast<unsigned>(grid), kRowThreads>>>(a);
  };
  const auto smem = [&](const PtQuantAmaxParams& a) {
    constexpr size_t bytes = tile_smem_bytes<T>();
    CHECK(cudaFuncSetAttribute(amax_tile_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    amax_tile_kernel<T><<<dim3((a.m + kTile - 1) / kTile, (a.k + kTile - 1) / kTile), kThreads, bytes>>>(a);
  };
  const auto regs = [&](const PtQuantAmaxParams& a) {
    amax_tile_regs_kernel<T><<<dim3((a.m + kTile - 1) / kTile, (a.k + kTile - 1) / kTile), kRegsThreads>>>(a);
  };
  using AmaxLaunch = std::function<void(const PtQuantAmaxParams&)>;
  for (const bool per_dim : {false, true}) {
    PtQuantAmaxParams a{m, k, x, buf, per_dim ? buf + 1 : nullptr, per_dim ? buf + 1 + m : nullptr, nullptr, num_sms};
    const std::vector<std::pair<const char*, AmaxLaunch>> impls = {
        {per_dim ? "smem tile" : "row walk", per_dim ? AmaxLaunch(smem) : AmaxLaunch(walk)}, {"regs tile", regs}};
    std::vector<uint8_t> first;
    for (size_t i = 0; i < impls.size(); ++i) {
      CHECK(cudaMemset(buf, 0, sizeof(float) * n));
      impls[i].second(a);
      CHECK(cudaDeviceSynchronize());
      CHECK(cudaGetLastError());
      std::vector<uint8_t> got = host(buf, sizeof(float) * n);
      if (i == 0)
        first = got;
      else if (got != first) {
        std::printf("MISMATCH %s amax%s [%lld x %lld]: %s differs\n", tag, per_dim ? " rows+cols" : "", (long long)m,
                    (long long)k, impls[i].first);
        ++failures;
      }
      if (timing) {
        const Launch f = [&](const PtQuantParams&) { impls[i].second(a); };
        const float us = time_us(f, PtQuantParams{}, 20);
        const double gbps = 2.0 * m * k / us / 1e3;
        std::printf("%-34s [%6lld x %6lld]  %-12s %8.1f us  %6.0f GB/s  %.2f of copy\n",
                    (std::string(tag) + (per_dim ? " amax rows+cols" : " amax tensor")).c_str(), (long long)m,
                    (long long)k, impls[i].first, us, gbps, gbps / copy_gbps);
      }
    }
    if (!timing)
      std::printf("%s amax%s [%lld x %lld]: identical\n", tag, per_dim ? " rows+cols" : "", (long long)m, (long long)k);
  }
  CHECK(cudaFree(buf));
}

template <class T, class F>
void run_shape(int64_t m, int64_t k, int num_sms, bool timing, const char* tag) {
  T* x;
  CHECK(cudaMalloc(&x, sizeof(T) * m * k));
  fill_random<<<1024, 256>>>(x, m * k, 1234u + static_cast<uint32_t>(m + k));
  Buffers ref = alloc(m, k), out = alloc(m, k);
  float *amax_rows, *amax_cols, *amax_tensor;
  CHECK(cudaMalloc(&amax_rows, sizeof(float) * m));
  CHECK(cudaMalloc(&amax_cols, sizeof(float) * k));
  CHECK(cudaMalloc(&amax_tensor, sizeof(float)));
  CHECK(cudaMemset(amax_rows, 0, sizeof(float) * m));
  CHECK(cudaMemset(amax_cols, 0, sizeof(float) * k));
  CHECK(cudaMemset(amax_tensor, 0, sizeof(float)));
  {
    PtQuantAmaxParams a{m, k, x, amax_tensor, amax_rows, amax_cols, nullptr, num_sms};
    constexpr size_t bytes = tile_smem_bytes<T>();
    CHECK(cudaFuncSetAttribute(amax_tile_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    amax_tile_kernel<T><<<dim3((m + kTile - 1) / kTile, (k + kTile - 1) / kTile), kThreads, bytes>>>(a);
    CHECK(cudaDeviceSynchronize());
  }
  // Copy ceiling: read 2 bytes and write 1 per element, as a 3 * m * k byte copy.
  double copy_gbps = 0;
  {
    const int64_t n16 = m * k * sizeof(T) / 16;
    uint4* y;
    CHECK(cudaMalloc(&y, n16 * 16));
    const Launch copy = [&](const PtQuantParams&) {
      copy_kernel<<<num_sms * 8, 512>>>(reinterpret_cast<const uint4*>(x), y, n16);
    };
    const float us = time_us(copy, PtQuantParams{}, 20);
    copy_gbps = 2.0 * n16 * 16 / us / 1e3;
    CHECK(cudaFree(y));
  }
  const int64_t pad_m = (m + 3) / 4 * 4, pad_k = (k + 3) / 4 * 4, kb = (k + 127) / 128, mb = (m + 127) / 128;
  const double both = 3.0 * m * k, row_only = 3.0 * m * k;  // bytes moved (x read, each output written)
  auto base = [&] {
    PtQuantParams p{};
    p.m = m, p.k = k, p.x = x, p.num_sms = num_sms, p.col_transposed = 1;
    return p;
  };
  std::string t(tag);
  {  // blockwise activation, the native GEMM path: 1 x 128 rows + 128 x 1 columns transposed, blocks-major
    PtQuantParams p = base();
    p.q_row = p.q_col = reinterpret_cast<void*>(1);
    p.row_block = p.col_block = 128;
    p.s_row_ld_mn = pad_m, p.s_col_ld_mn = pad_k;
    compare((t + " blockwise row+col^T").c_str(), p,
            {{"smem tile", smem_tile<T, F>()}, {"regs tile", regs_tile<T, F>()}}, ref, out, both + m * k, copy_gbps,
            timing);
  }
  {  // blockwise activation, public layout (scales row-major)
    PtQuantParams p = base();
    p.q_row = p.q_col = reinterpret_cast<void*>(1);
    p.row_block = p.col_block = 128;
    compare((t + " blockwise row+col^T rowmajor s").c_str(), p,
            {{"smem tile", smem_tile<T, F>()}, {"regs tile", regs_tile<T, F>()}}, ref, out, both + m * k, copy_gbps,
            timing);
  }
  {  // blockwise weight: 128 x 128 blocks, padded 2-D scales
    PtQuantParams p = base();
    p.q_row = p.q_col = reinterpret_cast<void*>(1);
    p.row_block = 128, p.col_block = 128, p.block_2d = 1;
    p.s_row_ld_2d = (kb + 3) / 4 * 4, p.s_col_ld_2d = (mb + 3) / 4 * 4;
    compare((t + " blockwise 2-D row+col^T").c_str(), p,
            {{"smem tile", smem_tile<T, F>()}, {"regs tile", regs_tile<T, F>()}}, ref, out, both + m * k, copy_gbps,
            timing);
  }
  {  // tensorwise: amax given
    PtQuantParams p = base();
    p.q_row = p.q_col = reinterpret_cast<void*>(1);
    p.amax_row = p.amax_col = amax_tensor;
    compare((t + " tensorwise row+col^T").c_str(), p,
            {{"smem tile", smem_tile<T, F>()}, {"regs tile", regs_tile<T, F>()}}, ref, out, both + m * k, copy_gbps,
            timing);
  }
  {  // rowwise: per-row and per-column amax given
    PtQuantParams p = base();
    p.q_row = p.q_col = reinterpret_cast<void*>(1);
    p.amax_row = amax_rows, p.amax_row_per_row = 1, p.amax_col = amax_cols, p.amax_col_per_col = 1;
    compare((t + " rowwise row+col^T").c_str(), p, {{"smem tile", smem_tile<T, F>()}, {"regs tile", regs_tile<T, F>()}},
            ref, out, both + m * k, copy_gbps, timing);
  }
  {  // column copy only (the output gradient's wgrad operand)
    PtQuantParams p = base();
    p.q_col = reinterpret_cast<void*>(1);
    p.col_block = 128, p.s_col_ld_mn = pad_k;
    compare((t + " blockwise col^T only").c_str(), p,
            {{"smem tile", smem_tile<T, F>()}, {"regs tile", regs_tile<T, F>()}}, ref, out, row_only, copy_gbps,
            timing);
  }
  {  // row copy only, 1 x 128: the row walk, the shared-memory tile and the register tile
    PtQuantParams p = base();
    p.q_row = reinterpret_cast<void*>(1);
    p.row_block = 128, p.s_row_ld_mn = pad_m;
    compare((t + " blockwise row only").c_str(), p,
            {{"row walk", row_walk<T, F>(num_sms)}, {"smem tile", smem_tile<T, F>()}, {"regs tile", regs_tile<T, F>()}},
            ref, out, row_only, copy_gbps, timing);
  }
  compare_amax(m, k, x, num_sms, timing, copy_gbps, t.c_str());
  {  // rowwise, row copy only: each row's amax in the quantize kernel
    PtQuantParams p = base();
    p.q_row = reinterpret_cast<void*>(1);
    p.row_amax_inline = 1;
    compare((t + " rowwise row only").c_str(), p,
            {{"two reads", rowwise_l2<T, F>(num_sms)}, {"registers", rowwise_regs<T, F>()}}, ref, out, row_only,
            copy_gbps, timing);
  }
  {  // row copy only, 1 x 128, scales row-major [m, blocks] (the public layout)
    PtQuantParams p = base();
    p.q_row = reinterpret_cast<void*>(1);
    p.row_block = 128;
    compare((t + " blockwise row only rowmajor s").c_str(), p,
            {{"row walk", row_walk<T, F>(num_sms)}, {"smem tile", smem_tile<T, F>()}, {"regs tile", regs_tile<T, F>()}},
            ref, out, row_only, copy_gbps, timing);
  }
  {  // the public BLOCKWISE with_trans: the column copy in place ([m, k] along m), scales row-major
    PtQuantParams p = base();
    p.q_row = p.q_col = reinterpret_cast<void*>(1);
    p.row_block = p.col_block = 128, p.col_transposed = 0;
    compare((t + " blockwise row+col in place").c_str(), p,
            {{"smem tile", smem_tile<T, F>()}, {"regs tile", regs_tile<T, F>()}}, ref, out, both + m * k, copy_gbps,
            timing);
  }
  if (timing) std::printf("copy of the same bytes: %.0f GB/s\n", copy_gbps);
  CHECK(cudaFree(x));
  release(ref);
  release(out);
  CHECK(cudaFree(amax_rows));
  CHECK(cudaFree(amax_cols));
  CHECK(cudaFree(amax_tensor));
}

// The per-row / per-column amax of x [m, k] (the register-tile amax kernel; col_rows: a stack's
// per-matrix columns, [m / col_rows, k]) into fresh zeroed buffers.
template <class T>
std::pair<float*, float*> amax_rows_cols(const T* x, int64_t m, int64_t k, int64_t col_rows) {
  const int64_t mats = col_rows ? m / col_rows : 1;
  float *rows, *cols;
  CHECK(cudaMalloc(&rows, sizeof(float) * m));
  CHECK(cudaMalloc(&cols, sizeof(float) * mats * k));
  CHECK(cudaMemset(rows, 0, sizeof(float) * m));
  CHECK(cudaMemset(cols, 0, sizeof(float) * mats * k));
  PtQuantAmaxParams a{};
  a.m = m, a.k = k, a.x = x, a.amax_rows = rows, a.amax_cols = cols, a.col_rows = col_rows;
  amax_tile_regs_kernel<T><<<dim3((m + 127) / 128, (k + 127) / 128), kRegsThreads>>>(a);
  CHECK(cudaGetLastError());
  return {rows, cols};
}

// Whether n bytes at `at` bytes into `whole` differ from `one` (1) or not (0).
int differs(const void* whole, size_t at, const void* one, size_t n) {
  return host(static_cast<const char*>(whole) + at, n) != host(one, n);
}

enum class StackScales { kTensorwise, kRowwise, kBlocks };

// A stack of b matrices [mm, k] quantized in one launch (col_rows = mm: each matrix's own transposed
// column output) against each matrix quantized alone: the same bytes, matrix by matrix. TENSORWISE
// shares one given amax; ROWWISE reduces its per-row and per-matrix column maxima in one amax launch
// (checked against each matrix's own); 2-D 128x128 blocks need none.
template <class T, class F>
void check_stack(int64_t b, int64_t mm, int64_t k, StackScales scales, const char* tag) {
  const bool rowwise = scales == StackScales::kRowwise, two_d = scales == StackScales::kBlocks;
  const int64_t m = b * mm, kb = (k + 127) / 128, mb = mm / 128;
  T* x;
  float* amax;
  CHECK(cudaMalloc(&x, sizeof(T) * m * k));
  CHECK(cudaMalloc(&amax, sizeof(float)));
  fill_random<<<1024, 256>>>(x, m * k, (rowwise ? 91u : 77u) + static_cast<uint32_t>(m + k));
  const float one_amax = 300.0f;
  CHECK(cudaMemcpy(amax, &one_amax, sizeof(float), cudaMemcpyHostToDevice));
  // Scale bytes of one matrix; TENSORWISE's one scale is the whole stack's (offset 0 for each).
  const size_t s_row_per = sizeof(float) * (two_d ? mb * kb : rowwise ? mm : 1);
  const size_t s_col_per = sizeof(float) * (two_d ? kb * mb : rowwise ? k : 1);
  const size_t s_step = scales == StackScales::kTensorwise ? 0 : 1;
  Buffers whole = alloc(m, k), one = alloc(mm, k);
  poison(whole);
  PtQuantParams p{};
  p.m = m, p.k = k, p.x = x, p.col_transposed = 1, p.col_rows = mm;
  p.q_row = whole.q_row, p.s_row = whole.s_row, p.q_col = whole.q_col, p.s_col = whole.s_col;
  std::pair<float*, float*> maxima{nullptr, nullptr};
  if (two_d) {
    p.row_block = p.col_block = 128, p.block_2d = 1;
  } else if (rowwise) {
    maxima = amax_rows_cols(x, m, k, mm);
    p.amax_row = maxima.first, p.amax_col = maxima.second, p.amax_row_per_row = p.amax_col_per_col = 1;
  } else {
    p.amax_row = p.amax_col = amax;
  }
  regs_tile<T, F>()(p);
  CHECK(cudaDeviceSynchronize());
  int bad = 0;
  for (int64_t g = 0; g < b; ++g) {
    poison(one);
    PtQuantParams q = p;
    q.m = mm, q.col_rows = 0, q.x = x + g * mm * k;
    q.q_row = one.q_row, q.s_row = one.s_row, q.q_col = one.q_col, q.s_col = one.s_col;
    std::pair<float*, float*> own{nullptr, nullptr};
    if (rowwise) {
      own = amax_rows_cols(static_cast<const T*>(q.x), mm, k, 0);
      bad += differs(maxima.first, g * mm * sizeof(float), own.first, mm * sizeof(float));
      bad += differs(maxima.second, g * k * sizeof(float), own.second, k * sizeof(float));
      q.amax_row = own.first, q.amax_col = own.second;
    }
    regs_tile<T, F>()(q);
    CHECK(cudaDeviceSynchronize());
    const size_t qb = mm * k;
    bad += differs(whole.q_row, g * qb, one.q_row, qb);
    bad += differs(whole.q_col, g * qb, one.q_col, qb);
    bad += differs(whole.s_row, g * s_step * s_row_per, one.s_row, s_row_per);
    bad += differs(whole.s_col, g * s_step * s_col_per, one.s_col, s_col_per);
    for (float* ptr : {own.first, own.second}) CHECK(cudaFree(ptr));
  }
  const char* kind = two_d ? "128x128 blocks" : rowwise ? "rowwise" : "tensorwise";
  std::printf("%s stack of %lld x [%lld x %lld] %s: %s\n", tag, static_cast<long long>(b),
              static_cast<long long>(mm), static_cast<long long>(k), kind,
              bad ? "MISMATCH" : "same as one matrix at a time");
  failures += bad;
  for (void* ptr : {static_cast<void*>(x), static_cast<void*>(amax), static_cast<void*>(maxima.first),
                    static_cast<void*>(maxima.second)})
    CHECK(cudaFree(ptr));
  release(whole);
  release(one);
}

int main(int argc, char** argv) {
  const bool small = argc > 1 && std::strcmp(argv[1], "--small") == 0;
  int dev = 0, num_sms = 0;
  CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, dev));
  using BF = __nv_bfloat16;
  // Odd shapes: correctness only (partial tiles in both dims).
  run_shape<BF, E4M3>(1040, 520, num_sms, false, "bf16>e4m3");
  run_shape<BF, E4M3>(16, 8, num_sms, false, "bf16>e4m3");
  run_shape<BF, E5M2>(400, 1288, num_sms, false, "bf16>e5m2");
  run_shape<__half, E4M3>(272, 136, num_sms, false, "fp16>e4m3");
  run_shape<BF, E4M3>(48, 18944, num_sms, false, "bf16>e4m3");
  run_shape<BF, E4M3>(48, 32768, num_sms, false, "bf16>e4m3");
  check_stack<BF, E4M3>(3, 256, 200, StackScales::kBlocks, "bf16>e4m3");
  check_stack<BF, E4M3>(5, 128, 136, StackScales::kTensorwise, "bf16>e4m3");
  check_stack<__half, E5M2>(2, 384, 1032, StackScales::kBlocks, "fp16>e5m2");
  check_stack<BF, E4M3>(3, 256, 200, StackScales::kRowwise, "bf16>e4m3");
  check_stack<__half, E5M2>(4, 128, 1032, StackScales::kRowwise, "fp16>e5m2");
  if (small) {
    std::printf(failures ? "FAILED: %d mismatches\n" : "all kernels agree\n", failures);
    return failures ? 1 : 0;
  }
  // Training shapes: correctness and time.
  run_shape<BF, E4M3>(65536, 4096, num_sms, true, "bf16>e4m3");
  run_shape<BF, E4M3>(8192, 4096, num_sms, true, "bf16>e4m3");
  run_shape<BF, E5M2>(8192, 14336, num_sms, true, "bf16>e5m2");
  run_shape<__half, E4M3>(8192, 4096, num_sms, true, "fp16>e4m3");
  std::printf(failures ? "FAILED: %d mismatches\n" : "all kernels agree\n", failures);
  return failures ? 1 : 0;
}
