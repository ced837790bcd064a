#include "ops/grouped_gemm/grouped_gemm_configs.h"

#include "core/error.h"

namespace primus_turbo::grouped_gemm {

std::string Config::name() const {
  return str_cat(tile_m, "x", tile_n, "x", tile_k, "_c", cluster_m, "x", cluster_n, "_",
                 pingpong ? "pingpong" : "coop");
}

const std::vector<Config>& candidates() {
  // Large cooperative tiles for many rows per expert; ping-pong and a 1x1 cluster for small or
  // skewed groups, where partial tiles and epilogue overlap matter more.
  static const std::vector<Config> configs = {
      {128, 256, 64, 2, 1, false},
      {256, 128, 64, 1, 2, false},
      {128, 128, 64, 2, 1, true},
      {128, 128, 64, 1, 1, false},
  };
  return configs;
}

int default_config(const Problem& p, int sm_count) {
  const auto ceil_div = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  // Group sizes are unknown on the host: estimate the 128x256 tiles from the packed extent.
  const int64_t big_tiles = p.wgrad
      ? p.groups * ceil_div(p.kernel_m(), 128) * ceil_div(p.kernel_n(), 256)
      : (ceil_div(p.rows, 128) + p.groups / 2) * ceil_div(p.kernel_n(), 256);
  return big_tiles >= 2 * sm_count ? 0 : 3;
}

}  // namespace primus_turbo::grouped_gemm
