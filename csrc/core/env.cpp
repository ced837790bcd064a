#include "core/env.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "core/error.h"

namespace primus_turbo {

std::string trim(const std::string& s) {
  const char* ws = " \t\r\n";
  const auto b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(ws);
  return s.substr(b, e - b + 1);
}

std::string to_upper(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::toupper(c); });
  return s;
}

std::optional<std::string> env_value(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  std::string t = trim(v);
  if (t.empty()) return std::nullopt;
  return t;
}

void make_dirs(const std::string& path) {
  if (path.empty()) return;
  std::string partial;
  std::stringstream ss(path);
  std::string part;
  if (path[0] == '/') partial = "/";
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    partial += part;
    if (mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
      PT_THROW(PT_ERROR_INTERNAL, "cannot create directory '", partial, "': ", std::strerror(errno));
    }
    partial += "/";
  }
}

std::string cache_root() {
  std::string root;
  if (auto v = env_value("PRIMUS_TURBO_CACHE_DIR")) {
    root = *v;
  } else if (auto x = env_value("XDG_CACHE_HOME")) {
    root = *x + "/primus_turbo";
  } else if (auto h = env_value("HOME")) {
    root = *h + "/.cache/primus_turbo";
  } else {
    root = "/tmp/primus_turbo_cache";
  }
  make_dirs(root);
  return root;
}

std::string unique_suffix() {
  static std::atomic<uint64_t> counter{0};
  std::random_device rd;
  return str_cat(getpid(), ".", counter.fetch_add(1), ".", rd());
}

void write_file_atomic(const std::string& path, const std::string& data) {
  const std::string tmp = str_cat(path, ".tmp.", unique_suffix());
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) PT_THROW(PT_ERROR_INTERNAL, "cannot write '", tmp, "': ", std::strerror(errno));
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = write(fd, data.data() + off, data.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      const std::string why = std::strerror(errno);
      close(fd);
      unlink(tmp.c_str());
      PT_THROW(PT_ERROR_INTERNAL, "cannot write '", tmp, "': ", why);
    }
    off += static_cast<size_t>(n);
  }
  fsync(fd);
  close(fd);
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    unlink(tmp.c_str());
    PT_THROW(PT_ERROR_INTERNAL, "cannot rename '", tmp, "' to '", path, "': ", why);
  }
}

bool read_file(const std::string& path, std::string* data) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream ss;
  ss << in.rdbuf();
  *data = ss.str();
  return true;
}

}  // namespace primus_turbo
