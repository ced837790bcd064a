// The tiny JIT module the runtime tests build: exports the ABI version and pt_test_answer().
// `tag` becomes a comment in the source, giving each test its own cache key even when all tests
// share one process (the in-memory registry outlives a test).
#pragma once

#include <string>

#include "runtime/jit_runtime.h"

namespace pt_test {

inline primus_turbo::jit::ModuleRequest tiny_module(const std::string& tag, int answer = 42) {
  primus_turbo::jit::ModuleRequest r;
  r.name = "pt_test_tiny";
  r.source = "#include \"primus_turbo/kernels/jit_export.cuh\"\n"
             "PT_JIT_EXPORT_ABI_VERSION\n"
             "extern \"C\" __attribute__((visibility(\"default\"))) int pt_test_answer() { return " +
             std::to_string(answer) + "; }\n// " + tag + "\n";
  r.needs_cutlass = false;
  return r;
}

using AnswerFn = int (*)();

}  // namespace pt_test
