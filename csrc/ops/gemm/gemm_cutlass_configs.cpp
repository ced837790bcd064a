#include "ops/gemm/gemm_cutlass_configs.h"

#include "core/error.h"

namespace primus_turbo::gemm {

std::string CutlassConfig::name() const {
  return str_cat(tile_m, "x", tile_n, "x", tile_k, "_c", cluster_m, "x", cluster_n, "_",
                 pingpong ? "pingpong" : "coop", swizzle > 1 ? str_cat("_s", swizzle) : "");
}

const std::vector<CutlassConfig>& cutlass_candidates() {
  // Large tiles for large problems (fewest global loads per FLOP), smaller and ping-pong tiles for
  // problems with few output tiles or short K, where epilogue overlap matters more.
  static const std::vector<CutlassConfig> configs = {
      {128, 256, 64, 2, 1, false},
      {256, 128, 64, 1, 2, false},
      {128, 256, 64, 1, 2, false},
      {128, 128, 64, 2, 1, false},
      {128, 128, 64, 1, 1, true},
      {64, 256, 64, 1, 1, true},
      // The large tiles again with swizzled tile order: neighbouring CTAs share A and B panels
      // in L2, which matters once the operands outgrow it (e.g. 8192^3).
      {128, 256, 64, 2, 1, false, 4},
      {256, 128, 64, 1, 2, false, 4},
      {128, 256, 64, 1, 2, false, 4},
      {128, 256, 64, 2, 1, false, 8},
  };
  return configs;
}

int cutlass_default_config(const Problem& p, int sm_count) {
  const auto ceil_div = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  // Enough 128x256 tiles to fill every SM at least twice: the big tile wins; otherwise a
  // 128x128 tile spreads the work over more SMs.
  const int64_t big_tiles = ceil_div(p.m, 128) * ceil_div(p.n, 256);
  return big_tiles >= 2 * sm_count ? 0 : 3;
}

}  // namespace primus_turbo::gemm
