// Index maps of the FP8 attention tiles, plain C++ so that host tests can check them
// (tests/cpp/test_attn_fp8_tile_map.cpp): where a key sits along V^T's rows, and which 16-byte
// chunks of a 128-row tile each quantizing thread holds.
#pragma once

#include "primus_turbo/kernels/attention/attention_fp8_abi.h"

#if defined(__CUDACC__)
#define PT_ATTN_FP8_HD __host__ __device__ __forceinline__
#else
#define PT_ATTN_FP8_HD inline
#endif

namespace primus_turbo::kernels::attention::fp8 {

constexpr int kTileRows = PT_ATTN_FP8_TILE_ROWS;
constexpr int kQuantThreads = 256;  // threads of a quantizing CTA

// Where key k of a 128-key block sits along V^T's rows. The forward's P V^T takes P straight from
// the softmax accumulators: a thread holds the scores of keys {2q, 2q + 1, 2q + 8, 2q + 9} (q =
// lane % 4) of each 16, while an 8-bit wgmma A operand in registers wants keys {4q .. 4q + 3}; so
// V^T stores key 2q + c + 8h (c, h in {0, 1}) at 4q + c + 2h, and P's registers follow.
PT_ATTN_FP8_HD int vt_slot(int k) { return (k & ~15) + 4 * ((k & 7) >> 1) + (k & 1) + 2 * ((k >> 3) & 1); }

// Which 16-byte chunk of a 128 x kCols tile (row, first column) register i of quantizing thread
// `thread` holds; false for the spare registers of a tile that does not split evenly.
//  - Row-major image (K): chunk c = thread + 256 i, rows in order, 16 lanes along a row of 128.
//  - Transposed image (V^T): registers 4p .. 4p + 3 hold a "quad", rows 16m + 2j + {0, 1, 8, 9},
//    whose bytes of one column are the four consecutive slots 16m + 4j .. + 3 of V^T's row
//    (vt_slot), so each column leaves as one 32-bit store, straight into the image, without a
//    shared-memory transpose. A warp takes 8 quads x 4 chunks of columns: its loads read 64
//    contiguous bytes of 8 rows, and its stores fill whole 32-byte sectors of 4 image rows.
template <int kCols, bool kTransposed>
struct TileChunks {
  static constexpr int kChunksPerRow = kCols / 8;
  static constexpr int kColGroups = kChunksPerRow / 4, kWarpTiles = 4 * kColGroups;  // transposed
  static constexpr int kPerThread =
      kTransposed ? 4 * ((kWarpTiles + 7) / 8) : kTileRows * kChunksPerRow / kQuantThreads;
  static_assert(kChunksPerRow % 4 == 0 && kTileRows * kChunksPerRow % kQuantThreads == 0, "tile split");

  PT_ATTN_FP8_HD static bool at(unsigned thread, int i, int& row, int& col) {
    if constexpr (!kTransposed) {
      const int c = thread + i * kQuantThreads;
      row = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
      return true;
    } else {
      const int lane = thread % 32, tile = thread / 32 + 8 * (i / 4);
      const int quad = (tile / kColGroups) * 8 + lane / 4, r = i % 4;
      row = 16 * (quad / 4) + 2 * (quad % 4) + (r & 1) + 8 * (r >> 1);
      col = ((tile % kColGroups) * 4 + lane % 4) * 8;
      return tile < kWarpTiles;
    }
  }
};

}  // namespace primus_turbo::kernels::attention::fp8
