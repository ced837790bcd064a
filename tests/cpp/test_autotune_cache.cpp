// The autotune cache: memory + a checksummed TSV file under the cache directory.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <thread>
#include <vector>

#include "core/sha256.h"
#include "dispatch/autotune_cache.h"
#include "test_util.h"

namespace {

namespace autotune = primus_turbo::autotune;
using pt_test::error_of;
using pt_test::read_text;
using pt_test::ScopedEnv;
using pt_test::TempDir;
using pt_test::write_text;
using ::testing::HasSubstr;

std::string checksum(const std::string& key, const std::string& value) {
  return primus_turbo::sha256_hex(key + "\t" + value).substr(0, 16);
}

std::string line(const std::string& key, const std::string& value) {
  return key + "\t" + value + "\t" + checksum(key, value) + "\n";
}

// Reads the file independently of the cache: every line must be sound.
std::map<std::string, std::string> parse_file(const std::string& path) {
  std::map<std::string, std::string> out;
  std::stringstream ss(read_text(path));
  std::string l;
  while (std::getline(ss, l)) {
    const auto t1 = l.find('\t');
    const auto t2 = l.find('\t', t1 + 1);
    EXPECT_NE(t2, std::string::npos) << "malformed line: " << l;
    if (t2 == std::string::npos) continue;
    const std::string key = l.substr(0, t1), value = l.substr(t1 + 1, t2 - t1 - 1);
    EXPECT_EQ(l.substr(t2 + 1), checksum(key, value)) << "bad checksum: " << l;
    out[key] = value;
  }
  return out;
}

// Each test gets its own cache directory and starts with an empty, not yet loaded cache.
class AutotuneCache : public ::testing::Test {
 protected:
  void SetUp() override { autotune::clear(true); }
  void TearDown() override { autotune::clear(true); }

  TempDir dir_;
  ScopedEnv cache_dir_{"PRIMUS_TURBO_CACHE_DIR", dir_.path()};
  ScopedEnv cache_file_{"PRIMUS_TURBO_AUTOTUNE_CACHE_FILE", nullptr};
};

TEST_F(AutotuneCache, FileLivesUnderTheCacheDirectoryAndNamesTheVersion) {
  EXPECT_EQ(autotune::cache_file(),
            dir_.path() + "/autotune/autotune-" + PT_VERSION_STRING + ".tsv");
  ScopedEnv file("PRIMUS_TURBO_AUTOTUNE_CACHE_FILE", dir_.path() + "/custom.tsv");
  EXPECT_EQ(autotune::cache_file(), dir_.path() + "/custom.tsv");
}

TEST_F(AutotuneCache, StoreThenLookup) {
  EXPECT_FALSE(autotune::lookup("gemm|h100|bf16|4096x4096x4096").has_value());
  autotune::store("gemm|h100|bf16|4096x4096x4096", "CUTLASS:3");
  EXPECT_EQ(autotune::lookup("gemm|h100|bf16|4096x4096x4096"), "CUTLASS:3");
  autotune::store("gemm|h100|bf16|4096x4096x4096", "CUBLASLT:0");  // a re-tune replaces it
  EXPECT_EQ(autotune::lookup("gemm|h100|bf16|4096x4096x4096"), "CUBLASLT:0");
  EXPECT_FALSE(autotune::lookup("gemm|h100|bf16|1x1x1").has_value());
}

TEST_F(AutotuneCache, StoreWritesOneChecksummedLinePerEntry) {
  autotune::store("k1", "v1");
  autotune::store("k2", "v two");
  autotune::store("k1", "v1b");
  EXPECT_EQ(read_text(autotune::cache_file()), line("k1", "v1b") + line("k2", "v two"));
}

TEST_F(AutotuneCache, EntriesSurviveIntoAFreshCache) {
  autotune::store("k", "v");
  const std::string persisted = read_text(autotune::cache_file());
  // clear(true) forgets memory and deletes the file; putting the file back is what a new
  // process would find.
  autotune::clear(true);
  EXPECT_FALSE(autotune::lookup("k").has_value());
  autotune::clear(true);
  write_text(autotune::cache_file(), persisted);
  EXPECT_EQ(autotune::lookup("k"), "v");
  EXPECT_EQ(autotune::corrupt_lines_seen(), 0);
}

TEST_F(AutotuneCache, ClearMemoryOnlyKeepsTheFileAndIsNotReloaded) {
  autotune::store("old", "1");
  autotune::clear(false);
  EXPECT_FALSE(autotune::lookup("old").has_value());  // forgotten in this process
  EXPECT_EQ(parse_file(autotune::cache_file()).count("old"), 1u);
  // The next store merges with the file rather than overwriting other entries.
  autotune::store("new", "2");
  const auto on_disk = parse_file(autotune::cache_file());
  EXPECT_EQ(on_disk.size(), 2u);
  EXPECT_EQ(on_disk.at("old"), "1");
  EXPECT_EQ(on_disk.at("new"), "2");
}

TEST_F(AutotuneCache, ClearAlsoDiskRemovesTheFile) {
  autotune::store("k", "v");
  autotune::clear(true);
  EXPECT_FALSE(std::filesystem::exists(autotune::cache_file()));
  EXPECT_FALSE(autotune::lookup("k").has_value());
}

TEST_F(AutotuneCache, CorruptLinesAreIgnoredAndDroppedAtTheNextStore) {
  write_text(autotune::cache_file(), line("good", "CUTLASS:1") +
                                         "bad\tCUBLASLT:0\t0123456789abcdef\n" +  // wrong checksum
                                         "torn\tCUTL");                            // truncated
  EXPECT_EQ(autotune::lookup("good"), "CUTLASS:1");
  EXPECT_FALSE(autotune::lookup("bad").has_value());
  EXPECT_FALSE(autotune::lookup("torn").has_value());
  EXPECT_EQ(autotune::corrupt_lines_seen(), 2);

  autotune::store("fresh", "CUBLASLT:2");
  EXPECT_EQ(read_text(autotune::cache_file()), line("fresh", "CUBLASLT:2") + line("good", "CUTLASS:1"));
}

TEST_F(AutotuneCache, TruncatedChecksumIsCorrupt) {
  const std::string good = line("k", "v");
  write_text(autotune::cache_file(), good.substr(0, good.size() - 5));  // lost its tail
  EXPECT_FALSE(autotune::lookup("k").has_value());
  EXPECT_EQ(autotune::corrupt_lines_seen(), 1);
}

TEST_F(AutotuneCache, KeysAndValuesWithSeparatorsAreRejected) {
  const std::pair<std::string, std::string> bad[] = {
      {"a\tb", "v"}, {"a\nb", "v"}, {"a\rb", "v"}, {"", "v"},
      {"k", "v\t1"}, {"k", "v\n"},  {"k", ""},
  };
  for (const auto& [k, v] : bad) {
    const auto e = error_of([&] { autotune::store(k, v); });
    EXPECT_EQ(e.status(), PT_ERROR_INVALID_ARGUMENT);
    EXPECT_THAT(e.what(), HasSubstr("free of tabs and newlines"));
  }
  EXPECT_FALSE(std::filesystem::exists(autotune::cache_file()));
  EXPECT_FALSE(autotune::lookup("k").has_value());
}

// Another rank writes between our stores: its entry must survive our next rewrite.
TEST_F(AutotuneCache, StoreMergesEntriesWrittenByAnotherProcess) {
  autotune::store("mine1", "a");
  write_text(autotune::cache_file(), read_text(autotune::cache_file()) + line("theirs", "b"));
  autotune::store("mine2", "c");
  const auto on_disk = parse_file(autotune::cache_file());
  EXPECT_EQ(on_disk.size(), 3u);
  EXPECT_EQ(on_disk.at("theirs"), "b");
}

TEST_F(AutotuneCache, ConcurrentStoresAllLand) {
  constexpr int kThreads = 4, kPerThread = 16;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < kPerThread; ++i) {
        autotune::store(primus_turbo::str_cat("t", t, "-", i), primus_turbo::str_cat("v", t * 100 + i));
      }
    });
  }
  for (auto& th : threads) th.join();

  const auto on_disk = parse_file(autotune::cache_file());
  EXPECT_EQ(on_disk.size(), size_t(kThreads * kPerThread));
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kPerThread; ++i) {
      const std::string key = primus_turbo::str_cat("t", t, "-", i);
      const std::string value = primus_turbo::str_cat("v", t * 100 + i);
      EXPECT_EQ(autotune::lookup(key), value);
      EXPECT_EQ(on_disk.count(key) ? on_disk.at(key) : "<missing>", value);
    }
  }
}

TEST_F(AutotuneCache, CApiLookupCopiesTheValue) {
  ASSERT_EQ(pt_autotune_store("key", "CUTLASS:7"), PT_SUCCESS);
  char buf[32];
  EXPECT_EQ(pt_autotune_lookup("key", buf, sizeof(buf)), 1);
  EXPECT_STREQ(buf, "CUTLASS:7");
  EXPECT_EQ(pt_autotune_lookup("missing", buf, sizeof(buf)), 0);
  EXPECT_EQ(pt_autotune_store("key", "a\tb"), PT_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(pt_last_error(), HasSubstr("free of tabs and newlines"));
  char path[4096];
  ASSERT_EQ(pt_autotune_cache_file(path, sizeof(path)), PT_SUCCESS);
  EXPECT_EQ(std::string(path), autotune::cache_file());
}

}  // namespace
