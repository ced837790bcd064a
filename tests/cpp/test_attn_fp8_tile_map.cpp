// The FP8 attention quantizer's tile maps (kernels/attention/attn_fp8_tile_map.h): every 16-byte
// chunk of a 128-row tile is held by exactly one (thread, register), and in the transposed map
// each quad's rows land on four consecutive V^T slots of one 64-row half, so a column of the quad
// is one 32-bit word of the image.
#include <gtest/gtest.h>

#include <set>
#include <utility>
#include <vector>

#include "primus_turbo/kernels/attention/attn_fp8_tile_map.h"

namespace {

namespace fp8 = primus_turbo::kernels::attention::fp8;

TEST(AttnFp8TileMap, VtSlotPermutesEachBlockOf16) {
  for (int base = 0; base < fp8::kTileRows; base += 16) {
    std::set<int> slots;
    for (int k = base; k < base + 16; ++k) slots.insert(fp8::vt_slot(k));
    EXPECT_EQ(slots.size(), 16u);
    EXPECT_EQ(*slots.begin(), base);
    EXPECT_EQ(*slots.rbegin(), base + 15);
  }
  // The accumulator pairs {2q, 2q + 1} and {2q + 8, 2q + 9} of a thread: slots 4q .. 4q + 3.
  for (int q = 0; q < 4; ++q) {
    EXPECT_EQ(fp8::vt_slot(2 * q), 4 * q);
    EXPECT_EQ(fp8::vt_slot(2 * q + 1), 4 * q + 1);
    EXPECT_EQ(fp8::vt_slot(2 * q + 8), 4 * q + 2);
    EXPECT_EQ(fp8::vt_slot(2 * q + 9), 4 * q + 3);
  }
}

template <int kCols, bool kTransposed>
void check_map() {
  using Map = fp8::TileChunks<kCols, kTransposed>;
  std::vector<int> held(fp8::kTileRows * (kCols / 8), 0);
  for (unsigned t = 0; t < fp8::kQuantThreads; ++t) {
    for (int i = 0; i < Map::kPerThread; ++i) {
      int row = -1, col = -1;
      if (!Map::at(t, i, row, col)) continue;
      ASSERT_TRUE(row >= 0 && row < fp8::kTileRows && col >= 0 && col < kCols && col % 8 == 0)
          << "thread " << t << " register " << i << ": (" << row << ", " << col << ")";
      ++held[row * (kCols / 8) + col / 8];
    }
    if (!kTransposed) continue;
    for (int g = 0; g < Map::kPerThread; g += 4) {
      int r0, c0;
      if (!Map::at(t, g, r0, c0)) continue;
      for (int k = 1; k < 4; ++k) {
        int r, c;
        ASSERT_TRUE(Map::at(t, g + k, r, c));
        EXPECT_EQ(c, c0);
        EXPECT_EQ(fp8::vt_slot(r), fp8::vt_slot(r0) + k) << "thread " << t << " quad " << g / 4;
        EXPECT_EQ(r / 64, r0 / 64) << "a quad's rows share their half's scale";
      }
    }
  }
  for (size_t c = 0; c < held.size(); ++c) EXPECT_EQ(held[c], 1) << "chunk " << c << " of " << kCols << " columns";
}

TEST(AttnFp8TileMap, RowMajorTilesCoverEveryChunkOnce) {
  check_map<64, false>();
  check_map<96, false>();
  check_map<128, false>();
  check_map<192, false>();
}

TEST(AttnFp8TileMap, TransposedTilesCoverEveryChunkOnceInQuads) {
  check_map<64, true>();
  check_map<96, true>();
  check_map<128, true>();
}

}  // namespace
