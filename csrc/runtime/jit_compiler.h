// Finds the CUDA compiler and turns one generated translation unit into a loadable module.
#pragma once

#include <string>
#include <vector>

namespace primus_turbo::jit {

struct Compiler {
  std::string path;      // absolute path of nvcc
  std::string identity;  // its `--version` text: part of every cache key
  int major = 0;
  int minor = 0;
};

// The compiler to use: $PRIMUS_TURBO_NVCC, $CUDA_HOME/bin/nvcc, $CUDA_PATH/bin/nvcc,
// /usr/local/cuda/bin/nvcc, then nvcc on PATH. Throws PT_ERROR_JIT naming every place looked at,
// or when the version is older than the kernels need (CUDA 12.4).
const Compiler& find_compiler();

// Parses "release X.Y" out of `nvcc --version` text; returns false if absent.
bool parse_nvcc_release(const std::string& text, int* major, int* minor);

// Flags every module is built with (also part of the cache key).
std::vector<std::string> module_flags(const std::string& arch);

// Compiles source_path into a shared object at output_path. On failure throws PT_ERROR_JIT with the
// command and the tail of the compiler's output.
void compile_module(const Compiler& compiler, const std::string& source_path,
                    const std::string& output_path, const std::vector<std::string>& include_dirs,
                    const std::string& arch, const std::string& log_path);

// Runs a shell command, capturing stdout+stderr; returns the exit status.
int run_command(const std::string& command, std::string* output);

std::string shell_quote(const std::string& s);

}  // namespace primus_turbo::jit
