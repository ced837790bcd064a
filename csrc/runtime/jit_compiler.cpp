#include "runtime/jit_compiler.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <mutex>
#include <regex>
#include <sstream>

#include "core/env.h"
#include "core/error.h"

namespace primus_turbo::jit {

namespace {

bool is_executable(const std::string& p) {
  struct stat st;
  return !p.empty() && stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(p.c_str(), X_OK) == 0;
}

std::string tail_lines(const std::string& text, size_t n) {
  size_t pos = text.size();
  for (size_t i = 0; i < n && pos > 0; ++i) {
    pos = text.rfind('\n', pos - 1);
    if (pos == std::string::npos) return text;
  }
  return text.substr(pos + 1);
}

}  // namespace

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += "'\\''";
    else out += c;
  }
  return out + "'";
}

int run_command(const std::string& command, std::string* output) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) PT_THROW(PT_ERROR_JIT, "cannot start command: ", command);
  std::array<char, 4096> buf;
  output->clear();
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) output->append(buf.data(), n);
  const int status = pclose(pipe);
  if (status == -1) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

bool parse_nvcc_release(const std::string& text, int* major, int* minor) {
  std::smatch m;
  static const std::regex re("release ([0-9]+)\\.([0-9]+)");
  if (!std::regex_search(text, m, re)) return false;
  *major = std::stoi(m[1]);
  *minor = std::stoi(m[2]);
  return true;
}

const Compiler& find_compiler() {
  static std::once_flag once;
  static Compiler compiler;
  static std::string failure;
  std::call_once(once, [] {
    std::vector<std::string> candidates;
    if (auto v = env_value("PRIMUS_TURBO_NVCC")) candidates.push_back(*v);
    if (auto v = env_value("CUDA_HOME")) candidates.push_back(*v + "/bin/nvcc");
    if (auto v = env_value("CUDA_PATH")) candidates.push_back(*v + "/bin/nvcc");
    candidates.push_back("/usr/local/cuda/bin/nvcc");
    if (auto path = env_value("PATH")) {
      std::stringstream ss(*path);
      std::string dir;
      while (std::getline(ss, dir, ':')) {
        if (!dir.empty()) candidates.push_back(dir + "/nvcc");
      }
    }
    for (const auto& c : candidates) {
      if (!is_executable(c)) continue;
      std::string out;
      if (run_command(shell_quote(c) + " --version", &out) != 0) continue;
      compiler.path = c;
      compiler.identity = out;
      if (!parse_nvcc_release(out, &compiler.major, &compiler.minor)) {
        failure = str_cat("cannot read the CUDA version from '", c, " --version': ", out);
        return;
      }
      if (compiler.major < 12 || (compiler.major == 12 && compiler.minor < 4)) {
        failure = str_cat("the CUDA compiler at ", c, " is release ", compiler.major, ".",
                          compiler.minor, "; Primus-Turbo's JIT kernels need CUDA 12.4 or newer ",
                          "(set PRIMUS_TURBO_NVCC or CUDA_HOME to a newer toolkit)");
      }
      return;
    }
    failure = "the CUDA compiler 'nvcc' was not found; looked at $PRIMUS_TURBO_NVCC, "
              "$CUDA_HOME/bin, $CUDA_PATH/bin, /usr/local/cuda/bin and $PATH. Install the CUDA "
              "toolkit (12.4 or newer) or point PRIMUS_TURBO_NVCC at nvcc.";
  });
  if (!failure.empty()) PT_THROW(PT_ERROR_JIT, failure);
  return compiler;
}

std::vector<std::string> module_flags(const std::string& arch) {
  return {"-std=c++17",
          "-O3",
          "-DNDEBUG",
          str_cat("-gencode=arch=compute_", arch, ",code=sm_", arch),
          "--expt-relaxed-constexpr",
          "-shared",
          "-Xcompiler=-fPIC,-fvisibility=hidden",
          // One shared CUDA runtime for every module (the one the framework already loaded).
          "-cudart=shared"};
}

void compile_module(const Compiler& compiler, const std::string& source_path,
                    const std::string& output_path, const std::vector<std::string>& include_dirs,
                    const std::string& arch, const std::string& log_path) {
  std::string cmd = shell_quote(compiler.path);
  for (const auto& f : module_flags(arch)) cmd += " " + f;
  for (const auto& dir : include_dirs) cmd += " -I" + shell_quote(dir);
  // Where to find libcudart when no framework has loaded it; a fallback, so not part of the key.
  const auto bin = compiler.path.rfind("/bin/");
  if (bin != std::string::npos) {
    cmd += " -Xlinker -rpath," + shell_quote(compiler.path.substr(0, bin) + "/lib64");
  }
  cmd += " " + shell_quote(source_path) + " -o " + shell_quote(output_path);
  std::string output;
  const int rc = run_command(cmd, &output);
  write_file_atomic(log_path, cmd + "\n" + output);
  if (rc != 0) {
    PT_THROW(PT_ERROR_JIT, "JIT compilation failed (exit ", rc, ")\ncommand: ", cmd,
             "\ncompiler output (last lines):\n", tail_lines(output, 40));
  }
}

}  // namespace primus_turbo::jit
