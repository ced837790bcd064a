#include "runtime/jit_runtime.h"

#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <vector>

#include "core/env.h"
#include "core/error.h"
#include "core/sha256.h"
#include "primus_turbo/kernels/jit_abi.h"
#include "runtime/jit_compiler.h"

namespace primus_turbo::jit {

namespace {

constexpr const char* kModuleFile = "module.so";
constexpr const char* kDigestFile = "module.sha256";

std::mutex g_mutex;
std::string g_cutlass_include;  // guarded by g_mutex
std::map<std::string, std::shared_ptr<const Module>> g_modules;
std::map<std::string, std::shared_future<std::shared_ptr<const Module>>> g_in_flight;
std::atomic<int64_t> g_compiled{0};
std::atomic<int64_t> g_loaded{0};

bool is_dir(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

void list_files(const std::string& dir, const std::string& rel, std::vector<std::string>* out) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    const std::string full = dir + "/" + name;
    const std::string r = rel.empty() ? name : rel + "/" + name;
    if (is_dir(full)) list_files(full, r, out);
    else out->push_back(r);
  }
  closedir(d);
}

void remove_tree(const std::string& path) {
  if (!is_dir(path)) {
    unlink(path.c_str());
    return;
  }
  std::vector<std::string> files;
  list_files(path, "", &files);
  for (const auto& f : files) unlink((path + "/" + f).c_str());
  // Subdirectories are not created by the runtime; a flat remove is enough.
  rmdir(path.c_str());
}

// The kernel headers a source includes, directly or through other kernel headers: quoted or
// angled includes that resolve under the kernel include root. Headers outside it (CUTLASS, CUDA,
// the standard library) are covered by the CUTLASS version and compiler identity in the key.
void collect_kernel_includes(const std::string& text, std::set<std::string>* seen) {
  const std::string root = kernel_include();
  size_t pos = 0;
  while ((pos = text.find("#include", pos)) != std::string::npos) {
    pos += 8;
    const size_t open = text.find_first_of("\"<\n", pos);
    if (open == std::string::npos || text[open] == '\n') continue;
    const size_t close = text.find_first_of("\">\n", open + 1);
    if (close == std::string::npos || text[close] == '\n') continue;
    const std::string rel = text.substr(open + 1, close - open - 1);
    std::string content;
    if (seen->count(rel) || !read_file(root + "/" + rel, &content)) continue;
    seen->insert(rel);
    collect_kernel_includes(content, seen);
  }
}

// Digest of the relative paths and contents of the kernel headers a source depends on: editing
// or adding one header rebuilds only the modules that include it.
std::string kernel_headers_digest(const std::string& source) {
  std::set<std::string> headers;
  collect_kernel_includes(source, &headers);
  const std::string root = kernel_include();
  Sha256 h;
  for (const auto& rel : headers) {  // std::set iterates in sorted order
    std::string content;
    read_file(root + "/" + rel, &content);
    h.update(rel).update("\0", 1).update(content).update("\0", 1);
  }
  return h.hex_digest();
}

std::string cutlass_version_digest() {
  std::string content;
  const std::string path = cutlass_include() + "/cutlass/version.h";
  PT_CHECK_ARG(read_file(path, &content), "CUTLASS headers not found: ", path,
               " does not exist (set PRIMUS_TURBO_CUTLASS_INCLUDE to the directory holding "
               "cutlass/ and cute/, e.g. the nvidia-cutlass package's "
               "cutlass_library/source/include)");
  return sha256_hex(content);
}

std::string library_dir() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&kernel_include), &info) == 0 || info.dli_fname == nullptr) {
    return ".";
  }
  std::string path = info.dli_fname;
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

std::string file_digest(const std::string& path) {
  std::string data;
  if (!read_file(path, &data)) return "";
  return sha256_hex(data);
}

// A published entry is usable when its shared object matches the digest written beside it.
bool entry_is_valid(const std::string& dir) {
  std::string recorded;
  if (!read_file(dir + "/" + kDigestFile, &recorded)) return false;
  recorded = trim(recorded);
  return !recorded.empty() && recorded == file_digest(dir + "/" + kModuleFile);
}

std::shared_ptr<const Module> load(const std::string& dir) {
  const std::string path = dir + "/" + kModuleFile;
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) PT_THROW(PT_ERROR_JIT, "cannot load JIT module ", path, ": ", dlerror());
  auto module = std::make_shared<const Module>(handle, path);
  auto version = module->function<PtJitAbiVersionFn>("pt_jit_abi_version");
  PT_CHECK_INTERNAL(version() == PT_JIT_ABI_VERSION, "JIT module ", path, " has ABI version ",
                    version(), ", expected ", PT_JIT_ABI_VERSION);
  return module;
}

// An exclusive advisory lock on one module's lock file, held while that module is built: when
// several processes (the ranks of a job) need the same new module, one compiles and the others wait
// for its entry instead of compiling it again. flock is released by the kernel when the holder
// exits or dies, so a crashed builder never blocks the rest; a waiter also polls for the published
// entry, so a lock that outlives its build (a child forked while it was held keeps it) never does.
class ModuleBuildLock {
 public:
  explicit ModuleBuildLock(const std::string& path) : fd_(open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)) {}
  ~ModuleBuildLock() {
    if (fd_ >= 0) close(fd_);  // closing releases the lock
  }
  ModuleBuildLock(const ModuleBuildLock&) = delete;
  ModuleBuildLock& operator=(const ModuleBuildLock&) = delete;

  // Takes the lock (true), or returns false as soon as published() finds the entry. An unwritable
  // cache (no lock file) builds without the cross-process wait.
  template <class Published>
  bool acquire_unless(Published published) {
    if (fd_ < 0) return true;
    while (true) {
      if (flock(fd_, LOCK_EX | LOCK_NB) == 0) return true;
      if (errno != EWOULDBLOCK && errno != EINTR) return true;
      if (published()) return false;
      usleep(50 * 1000);
    }
  }

 private:
  int fd_;
};

// The published entry at final_dir if it is sound; a corrupt or half-deleted one is moved out of
// the way atomically (and rebuilt by the caller).
std::shared_ptr<const Module> load_published(const std::string& root, const std::string& final_dir) {
  if (!is_dir(final_dir)) return nullptr;
  if (entry_is_valid(final_dir)) {
    ++g_loaded;
    return load(final_dir);
  }
  const std::string trash = str_cat(root, "/.trash-", unique_suffix());
  if (rename(final_dir.c_str(), trash.c_str()) == 0) remove_tree(trash);
  return nullptr;
}

// Read-only caches searched after the user's: the modules built ahead of time at install
// (<lib>/../prebuilt/jit) and the folders in $PRIMUS_TURBO_PREBUILT_DIR (':'-separated, each holding
// entries as a jit cache does). Entries are checked against their digest like the user's, but a
// bad one is skipped, never moved or rebuilt there.
std::vector<std::string> prebuilt_dirs() {
  std::vector<std::string> dirs;
  // Set while building modules into a folder (precompile --cache-dir): nothing is taken from here.
  if (auto off = env_value("PRIMUS_TURBO_NO_PREBUILT"); off && *off != "0") return dirs;
  if (auto v = env_value("PRIMUS_TURBO_PREBUILT_DIR")) {
    size_t start = 0;
    while (start <= v->size()) {
      const size_t end = v->find(':', start);
      const std::string dir = v->substr(start, end == std::string::npos ? std::string::npos : end - start);
      if (!dir.empty()) dirs.push_back(dir);
      if (end == std::string::npos) break;
      start = end + 1;
    }
  }
  dirs.push_back(library_dir() + "/../prebuilt/jit");
  return dirs;
}

std::shared_ptr<const Module> load_prebuilt(const std::string& entry) {
  for (const auto& dir : prebuilt_dirs()) {
    const std::string candidate = str_cat(dir, "/", entry);
    if (is_dir(candidate) && entry_is_valid(candidate)) {
      ++g_loaded;
      return load(candidate);
    }
  }
  return nullptr;
}

std::shared_ptr<const Module> build_or_load(const ModuleRequest& request, const std::string& key) {
  const std::string entry = str_cat(request.name, "-", key.substr(0, 20));
  std::string root;
  try {
    root = jit_cache_dir();
  } catch (const Error&) {
    // No writable cache (a read-only home, say): a prebuilt module still serves.
    if (auto module = load_prebuilt(entry)) return module;
    throw;
  }
  const std::string final_dir = str_cat(root, "/", entry);
  if (auto module = load_published(root, final_dir)) return module;
  if (auto module = load_prebuilt(entry)) return module;
  ModuleBuildLock build_lock(str_cat(root, "/.lock-", entry));
  if (!build_lock.acquire_unless([&] { return is_dir(final_dir) && entry_is_valid(final_dir); })) {
    ++g_loaded;
    return load(final_dir);  // published by the process that held the lock
  }
  // Another process may have published the entry just before this one took the lock.
  if (auto module = load_published(root, final_dir)) return module;

  const Compiler& compiler = find_compiler();
  const std::string tmp = str_cat(root, "/.tmp-", unique_suffix());
  make_dirs(tmp);
  try {
    const std::string src = tmp + "/kernel.cu";
    write_file_atomic(src, request.source);
    std::vector<std::string> includes = {kernel_include()};
    if (request.needs_cutlass) includes.push_back(cutlass_include());
    compile_module(compiler, src, tmp + "/" + kModuleFile, includes, request.arch,
                   tmp + "/build.log");
    write_file_atomic(tmp + "/" + kDigestFile, file_digest(tmp + "/" + kModuleFile) + "\n");
  } catch (...) {
    remove_tree(tmp);
    throw;
  }
  ++g_compiled;
  if (rename(tmp.c_str(), final_dir.c_str()) != 0) {
    // Another process published the same key first: use theirs if it is sound.
    remove_tree(tmp);
    PT_CHECK_INTERNAL(entry_is_valid(final_dir), "cannot publish JIT module to ", final_dir, ": ",
                      std::strerror(errno));
  }
  return load(final_dir);
}

}  // namespace

void* Module::symbol(const char* name) const {
  dlerror();
  void* sym = dlsym(handle_, name);
  if (sym == nullptr) PT_THROW(PT_ERROR_JIT, "JIT module ", path_, " has no symbol '", name, "'");
  return sym;
}

void set_cutlass_include(const std::string& path) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_cutlass_include = path;
}

std::string cutlass_include() {
  if (auto v = env_value("PRIMUS_TURBO_CUTLASS_INCLUDE")) return *v;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_cutlass_include.empty()) {
    PT_THROW(PT_ERROR_JIT,
             "CUTLASS headers are not configured: install the nvidia-cutlass package (the Python "
             "binding finds it) or set PRIMUS_TURBO_CUTLASS_INCLUDE");
  }
  return g_cutlass_include;
}

std::string kernel_include() {
  if (auto v = env_value("PRIMUS_TURBO_KERNEL_INCLUDE")) return *v;
  return library_dir() + "/../kernels";
}

std::string jit_cache_dir() {
  const std::string dir = cache_root() + "/jit";
  make_dirs(dir);
  return dir;
}

std::string module_key(const ModuleRequest& request) {
  Sha256 h;
  h.update(str_cat("abi=", PT_JIT_ABI_VERSION, "\n"));
  h.update(request.source).update("\n");
  h.update("kernels=").update(kernel_headers_digest(request.source)).update("\n");
  if (request.needs_cutlass) h.update("cutlass=").update(cutlass_version_digest()).update("\n");
  h.update("compiler=").update(find_compiler().identity).update("\n");
  for (const auto& f : module_flags(request.arch)) h.update(f).update(" ");
  return h.hex_digest();
}

std::shared_ptr<const Module> get_module(const ModuleRequest& request) {
  const std::string key = module_key(request);
  std::promise<std::shared_ptr<const Module>> promise;
  {
    std::unique_lock<std::mutex> lock(g_mutex);
    auto it = g_modules.find(key);
    if (it != g_modules.end()) return it->second;
    auto flight = g_in_flight.find(key);
    if (flight != g_in_flight.end()) {
      auto future = flight->second;
      lock.unlock();
      return future.get();  // rethrows the builder's error
    }
    g_in_flight.emplace(key, promise.get_future().share());
  }
  std::shared_ptr<const Module> module;
  try {
    module = build_or_load(request, key);
  } catch (...) {
    promise.set_exception(std::current_exception());
    std::lock_guard<std::mutex> lock(g_mutex);
    g_in_flight.erase(key);
    throw;
  }
  promise.set_value(module);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_modules.emplace(key, module);
  g_in_flight.erase(key);
  return module;
}

Stats stats() { return Stats{g_compiled.load(), g_loaded.load()}; }

}  // namespace primus_turbo::jit
