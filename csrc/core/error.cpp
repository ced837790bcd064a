#include "core/error.h"

#include <cstring>

namespace primus_turbo {

namespace {
thread_local std::string g_last_error;
}

void set_last_error(const std::string& message) { g_last_error = message; }

const char* last_error() { return g_last_error.c_str(); }

void copy_out(const std::string& s, char* buf, size_t len, const char* what) {
  PT_CHECK_ARG(buf != nullptr && len > 0, what, ": output buffer is null or empty");
  PT_CHECK_ARG(s.size() < len, what, ": output buffer of ", len, " bytes is too small for ",
               s.size() + 1, " bytes");
  std::memcpy(buf, s.c_str(), s.size() + 1);
}

}  // namespace primus_turbo
