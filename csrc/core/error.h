// Errors inside the core are C++ exceptions carrying a pt_status; the C API boundary turns them
// into a status plus a thread-local message (pt_last_error), so nothing ever aborts the process.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "primus_turbo/primus_turbo.h"

namespace primus_turbo {

class Error : public std::runtime_error {
 public:
  Error(pt_status status, const std::string& message)
      : std::runtime_error(message), status_(status) {}
  pt_status status() const { return status_; }

 private:
  pt_status status_;
};

template <class... Args>
std::string str_cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

void set_last_error(const std::string& message);
const char* last_error();

// Runs body, translating any exception into a status and the thread's last-error message.
template <class Body>
pt_status api_guard(Body&& body) {
  try {
    body();
    set_last_error("");
    return PT_SUCCESS;
  } catch (const Error& e) {
    set_last_error(e.what());
    return e.status();
  } catch (const std::exception& e) {
    set_last_error(str_cat("internal error: ", e.what()));
    return PT_ERROR_INTERNAL;
  } catch (...) {
    set_last_error("internal error: unknown exception");
    return PT_ERROR_INTERNAL;
  }
}

// Copies s into a caller buffer, always NUL-terminated; throws if it does not fit.
void copy_out(const std::string& s, char* buf, size_t len, const char* what);

}  // namespace primus_turbo

#define PT_THROW(status, ...) throw ::primus_turbo::Error((status), ::primus_turbo::str_cat(__VA_ARGS__))

// Argument checks: the message names the argument and says what was expected and what was got.
#define PT_CHECK_ARG(cond, ...)                                  \
  do {                                                           \
    if (!(cond)) PT_THROW(PT_ERROR_INVALID_ARGUMENT, __VA_ARGS__); \
  } while (0)

#define PT_CHECK_SUPPORTED(cond, ...)                        \
  do {                                                       \
    if (!(cond)) PT_THROW(PT_ERROR_NOT_SUPPORTED, __VA_ARGS__); \
  } while (0)

#define PT_CHECK_INTERNAL(cond, ...)                                                   \
  do {                                                                                 \
    if (!(cond)) PT_THROW(PT_ERROR_INTERNAL, __FILE__, ":", __LINE__, ": ", __VA_ARGS__); \
  } while (0)
