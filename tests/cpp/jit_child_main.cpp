// Helper process for test_jit_runtime: asks for tiny_module(argv[1]) with an empty in-memory
// registry, as a new process would, and prints what the runtime did.
#include <cstdio>
#include <exception>

#include "jit_test_module.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <tag>\n", argv[0]);
    return 2;
  }
  try {
    auto module = primus_turbo::jit::get_module(pt_test::tiny_module(argv[1]));
    const int answer = module->function<pt_test::AnswerFn>("pt_test_answer")();
    const auto s = primus_turbo::jit::stats();
    std::printf("compiled=%lld loaded=%lld answer=%d\n", static_cast<long long>(s.compiled),
                static_cast<long long>(s.loaded_from_disk), answer);
    return 0;
  } catch (const std::exception& e) {
    std::printf("error: %s\n", e.what());
    return 1;
  }
}
