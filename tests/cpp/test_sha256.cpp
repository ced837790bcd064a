// SHA-256 against the FIPS 180-4 / NIST example vectors and at the padding boundaries.
#include <gtest/gtest.h>

#include <string>

#include "core/sha256.h"

namespace {

using primus_turbo::Sha256;
using primus_turbo::sha256_hex;

TEST(Sha256, EmptyString) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(Sha256, Abc) {
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Sha256, TwoBlockMessage448Bits) {
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Sha256, Message896Bits) {
  EXPECT_EQ(sha256_hex("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklm"
                       "nopqklmnopqrlmnopqrsmnopqrstnopqrstu"),
            "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
}

TEST(Sha256, MillionAsInOddSizedIncrementalUpdates) {
  const std::string chunk(997, 'a');  // prime size: chunks straddle every block boundary
  Sha256 h;
  size_t left = 1000000;
  for (size_t step = 1; left > 0; step = (step * 7 + 13) % chunk.size() + 1) {
    const size_t n = std::min(step, left);  // 1..997 bytes
    h.update(chunk.data(), n);
    left -= n;
  }
  EXPECT_EQ(h.hex_digest(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// Lengths where the padding needs one extra block (56..63) or exactly fills one.
TEST(Sha256, PaddingBoundaries) {
  const struct {
    size_t len;
    const char* digest;
  } cases[] = {
      {55, "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318"},
      {56, "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a"},
      {57, "f13b2d724659eb3bf47f2dd6af1accc87b81f09f59f2b75e5c0bed6589dfe8c6"},
      {63, "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34"},
      {64, "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb"},
      {65, "635361c48bb9eab14198e76ea8ab7f1a41685d6ad62aa9146d301d4f17eb0ae0"},
      {119, "31eba51c313a5c08226adf18d4a359cfdfd8d2e816b13f4af952f7ea6584dcfb"},
      {120, "2f3d335432c70b580af0e8e1b3674a7c020d683aa5f73aaaedfdc55af904c21c"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.len);
    const std::string msg(c.len, 'a');
    EXPECT_EQ(sha256_hex(msg), c.digest);
    Sha256 bytewise;
    for (char ch : msg) bytewise.update(&ch, 1);
    EXPECT_EQ(bytewise.hex_digest(), c.digest);
  }
}

TEST(Sha256, EmbeddedNulBytesAreHashed) {
  EXPECT_NE(sha256_hex(std::string("a\0b", 3)), sha256_hex("ab"));
  EXPECT_EQ(Sha256().update("a", 1).update("\0", 1).update("b", 1).hex_digest(),
            sha256_hex(std::string("a\0b", 3)));
}

}  // namespace
