// SHA-256 (FIPS 180-4), used to content-address JIT modules and to detect corrupt cache entries.
#pragma once

#include <cstdint>
#include <string>

namespace primus_turbo {

class Sha256 {
 public:
  Sha256();
  Sha256& update(const void* data, size_t len);
  Sha256& update(const std::string& s) { return update(s.data(), s.size()); }
  std::string hex_digest();  // finalizes; the object must not be updated afterwards

 private:
  void compress(const uint8_t* block);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_len_ = 0;
};

std::string sha256_hex(const std::string& data);

}  // namespace primus_turbo
