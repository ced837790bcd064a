// C API of the cross-cutting services: errors, version, backend settings, autotune cache, JIT.
#include <cstring>

#include "core/error.h"
#include "dispatch/autotune_cache.h"
#include "dispatch/backend_settings.h"
#include "runtime/jit_runtime.h"

using namespace primus_turbo;

namespace {

void write_choice(const BackendChoice& c, int32_t* backend, int32_t* auto_tune) {
  PT_CHECK_ARG(backend && auto_tune, "output pointers must not be null");
  *backend = c.backend;
  *auto_tune = c.auto_tune;
}

}  // namespace

extern "C" {

const char* pt_last_error(void) { return last_error(); }

const char* pt_version(void) { return PT_VERSION_STRING; }

pt_status pt_backend_from_name(const char* name, int32_t* backend) {
  return api_guard([&] {
    PT_CHECK_ARG(name && backend, "name and backend must not be null");
    *backend = backend_from_name(name);
  });
}

const char* pt_backend_name(int32_t backend) { return backend_name(backend); }

pt_status pt_backend_set(int32_t op, int32_t precision, int32_t backend, int32_t auto_tune) {
  return api_guard([&] {
    set_code_choice(op, precision, BackendChoice{backend, auto_tune != 0});
    touch_settings();
  });
}

pt_status pt_backend_get_code(int32_t op, int32_t precision, int32_t* backend, int32_t* auto_tune) {
  return api_guard([&] { write_choice(code_choice(op, precision), backend, auto_tune); });
}

pt_status pt_backend_get_env(int32_t op, int32_t precision, int32_t* backend, int32_t* auto_tune) {
  return api_guard([&] { write_choice(env_choice(op, precision), backend, auto_tune); });
}

pt_status pt_autotune_set_enabled(int32_t enabled) {
  return api_guard([&] {
    set_auto_tune_code(enabled < 0 ? std::nullopt : std::optional<bool>(enabled != 0));
    touch_settings();
  });
}

int32_t pt_autotune_enabled(void) {
  int32_t result = 0;
  // A malformed PRIMUS_TURBO_AUTO_TUNE is reported by pt_backend_resolve; here it reads as off.
  api_guard([&] { result = auto_tune_enabled(); });
  return result;
}

pt_status pt_backend_resolve(int32_t op, int32_t precision, int32_t* backend, int32_t* auto_tune) {
  return api_guard([&] { write_choice(resolve_choice(op, precision), backend, auto_tune); });
}

pt_status pt_backend_reset(void) {
  return api_guard([&] {
    reset_backend_settings();
    touch_settings();
  });
}

int32_t pt_autotune_lookup(const char* key, char* value, size_t value_len) {
  int32_t found = 0;
  api_guard([&] {
    PT_CHECK_ARG(key != nullptr, "key must not be null");
    auto v = autotune::lookup(key);
    if (!v) return;
    copy_out(*v, value, value_len, "value");
    found = 1;
  });
  return found;
}

pt_status pt_autotune_store(const char* key, const char* value) {
  return api_guard([&] {
    PT_CHECK_ARG(key && value, "key and value must not be null");
    autotune::store(key, value);
  });
}

pt_status pt_autotune_clear(int32_t also_disk) {
  return api_guard([&] {
    autotune::clear(also_disk != 0);
    touch_settings();
  });
}

uint64_t pt_settings_epoch(void) { return settings_epoch(); }

void pt_settings_touch(void) { touch_settings(); }

pt_status pt_autotune_cache_file(char* path, size_t path_len) {
  return api_guard([&] { copy_out(autotune::cache_file(), path, path_len, "path"); });
}

pt_status pt_jit_set_cutlass_include(const char* path) {
  return api_guard([&] {
    PT_CHECK_ARG(path != nullptr, "path must not be null");
    jit::set_cutlass_include(path);
  });
}

pt_status pt_jit_cache_dir(char* path, size_t path_len) {
  return api_guard([&] { copy_out(jit::jit_cache_dir(), path, path_len, "path"); });
}

pt_status pt_jit_stats(int64_t* compiled, int64_t* loaded_from_disk) {
  return api_guard([&] {
    PT_CHECK_ARG(compiled && loaded_from_disk, "output pointers must not be null");
    const auto s = jit::stats();
    *compiled = s.compiled;
    *loaded_from_disk = s.loaded_from_disk;
  });
}

}  // extern "C"
