#include "dispatch/autotune_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <map>
#include <mutex>
#include <sstream>

#include "core/env.h"
#include "core/error.h"
#include "core/sha256.h"

namespace primus_turbo::autotune {

namespace {

std::mutex g_mutex;
std::map<std::string, std::string> g_entries;
bool g_loaded = false;
int g_corrupt = 0;

std::string checksum(const std::string& key, const std::string& value) {
  return sha256_hex(key + "\t" + value).substr(0, 16);
}

bool valid_field(const std::string& s) {
  return !s.empty() && s.find_first_of("\t\n\r") == std::string::npos;
}

// Parses the file's sound lines into out; counts the rest.
int parse(const std::string& text, std::map<std::string, std::string>* out) {
  int corrupt = 0;
  std::stringstream ss(text);
  std::string line;
  while (std::getline(ss, line)) {
    if (line.empty()) continue;
    const auto t1 = line.find('\t');
    const auto t2 = t1 == std::string::npos ? t1 : line.find('\t', t1 + 1);
    if (t2 == std::string::npos) {
      ++corrupt;
      continue;
    }
    std::string key = line.substr(0, t1), value = line.substr(t1 + 1, t2 - t1 - 1);
    if (line.substr(t2 + 1) != checksum(key, value)) {
      ++corrupt;
      continue;
    }
    (*out)[key] = value;
  }
  return corrupt;
}

void load_locked() {
  if (g_loaded) return;
  g_loaded = true;
  std::string text;
  if (read_file(cache_file(), &text)) g_corrupt = parse(text, &g_entries);
}

// Holds an exclusive advisory lock on <file>.lock while merging, so ranks do not lose entries.
class FileLock {
 public:
  explicit FileLock(const std::string& path) {
    fd_ = open(path.c_str(), O_RDWR | O_CREAT, 0644);
    if (fd_ >= 0) flock(fd_, LOCK_EX);
  }
  ~FileLock() {
    if (fd_ >= 0) {
      flock(fd_, LOCK_UN);
      close(fd_);
    }
  }

 private:
  int fd_ = -1;
};

}  // namespace

std::string cache_file() {
  if (auto v = env_value("PRIMUS_TURBO_AUTOTUNE_CACHE_FILE")) return *v;
  const std::string dir = cache_root() + "/autotune";
  make_dirs(dir);
  return str_cat(dir, "/autotune-", PT_VERSION_STRING, ".tsv");
}

std::optional<std::string> lookup(const std::string& key) {
  std::lock_guard<std::mutex> lock(g_mutex);
  load_locked();
  auto it = g_entries.find(key);
  if (it == g_entries.end()) return std::nullopt;
  return it->second;
}

void store(const std::string& key, const std::string& value) {
  PT_CHECK_ARG(valid_field(key), "autotune key must be non-empty and free of tabs and newlines");
  PT_CHECK_ARG(valid_field(value), "autotune value must be non-empty and free of tabs and newlines");
  std::lock_guard<std::mutex> lock(g_mutex);
  load_locked();
  g_entries[key] = value;
  const std::string path = cache_file();
  FileLock file_lock(path + ".lock");
  std::map<std::string, std::string> merged;
  std::string text;
  if (read_file(path, &text)) parse(text, &merged);
  for (const auto& [k, v] : g_entries) merged[k] = v;
  std::string out;
  for (const auto& [k, v] : merged) out += k + "\t" + v + "\t" + checksum(k, v) + "\n";
  write_file_atomic(path, out);
}

void clear(bool also_disk) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_entries.clear();
  g_loaded = !also_disk;  // memory-only: do not re-read the file in this process
  g_corrupt = 0;
  if (also_disk) unlink(cache_file().c_str());
}

int corrupt_lines_seen() {
  std::lock_guard<std::mutex> lock(g_mutex);
  load_locked();
  return g_corrupt;
}

}  // namespace primus_turbo::autotune
