// The just-in-time kernel runtime.
//
// A kernel is a C++/CUDA template in a header under csrc/kernels; an operator asks for one
// configuration by handing over a few generated lines that instantiate it. The runtime
//   1. content-addresses the request: SHA-256 of the ABI version, the generated source, every
//      kernel header's content, the CUTLASS version, the compiler's identity, flags and arch
//      (never an install path, so a reinstall of the same sources keeps its cache);
//   2. returns the module from memory, else from <cache>/jit/<name>-<hash> after checking the
//      shared object against its recorded digest (a truncated or corrupt entry is rebuilt);
//   3. else compiles it in a private temporary directory and publishes it with one atomic
//      rename, so any number of ranks can race on the same kernel safely.
// Several threads may ask at once; each distinct module is built once per process.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

namespace primus_turbo::jit {

class Module {
 public:
  Module(void* handle, std::string path) : handle_(handle), path_(std::move(path)) {}
  // Modules are never unloaded: kernels may still be queued or captured in a CUDA graph.
  void* symbol(const char* name) const;
  template <class Fn>
  Fn function(const char* name) const {
    return reinterpret_cast<Fn>(symbol(name));
  }
  const std::string& path() const { return path_; }

 private:
  void* handle_;
  std::string path_;
};

struct ModuleRequest {
  std::string name;    // readable part of the cache entry's name, e.g. gemm_cutlass_bf16_tn_...
  std::string source;  // the generated translation unit
  bool needs_cutlass = false;
  std::string arch = "90a";
};

std::shared_ptr<const Module> get_module(const ModuleRequest& request);

// The cache key a request maps to (exposed for tests).
std::string module_key(const ModuleRequest& request);

void set_cutlass_include(const std::string& path);
// $PRIMUS_TURBO_CUTLASS_INCLUDE, else what the binding set; throws PT_ERROR_JIT if neither.
std::string cutlass_include();
// $PRIMUS_TURBO_KERNEL_INCLUDE, else <directory of this library>/../kernels.
std::string kernel_include();
std::string jit_cache_dir();

// What an operator loaded from its modules (entry points), by key: after the first call for a key,
// one map lookup under a mutex. make() may compile, so it runs outside the lock and other keys
// build in parallel; threads that race on a new key each call make() (get_module builds a module
// once) and the first value stored is kept.
template <class Key, class Value>
class LoadedCache {
 public:
  template <class Make>
  Value get(const Key& key, Make&& make) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = values_.find(key);
      if (it != values_.end()) return it->second;
    }
    Value value = std::forward<Make>(make)();
    std::lock_guard<std::mutex> lock(mutex_);
    values_.emplace(key, value);
    return value;
  }

 private:
  std::mutex mutex_;
  std::map<Key, Value> values_;
};

struct Stats {
  int64_t compiled = 0;
  int64_t loaded_from_disk = 0;
};
Stats stats();

}  // namespace primus_turbo::jit
