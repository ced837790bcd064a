// The JIT runtime end to end with a tiny module: content-addressed keys, compile once, the
// on-disk cache across processes (including a corrupt entry) and concurrent requests.
// Needs nvcc but no GPU: the module has no device code that runs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <future>
#include <sstream>
#include <thread>
#include <vector>

#include "core/env.h"
#include "core/sha256.h"
#include "jit_test_module.h"
#include "runtime/jit_compiler.h"
#include "runtime/jit_runtime.h"
#include "test_util.h"

namespace {

using namespace primus_turbo::jit;
using primus_turbo::sha256_hex;
using primus_turbo::trim;
using pt_test::AnswerFn;
using pt_test::error_of;
using pt_test::read_text;
using pt_test::ScopedEnv;
using pt_test::TempDir;
using pt_test::tiny_module;
using pt_test::write_text;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

class JitRuntime : public ::testing::Test {
 protected:
  // A tag no earlier request in this process used (tests may share a process, or be repeated).
  static std::string fresh_tag(const char* what) {
    return primus_turbo::str_cat(what, "-", primus_turbo::unique_suffix());
  }
  // Where the runtime publishes a request: <cache>/jit/<name>-<first 20 hex digits of the key>.
  std::string entry_dir(const ModuleRequest& r) {
    return jit_cache_dir() + "/" + r.name + "-" + module_key(r).substr(0, 20);
  }
  // Everything in the JIT cache directory, so leftovers (.tmp-, .trash-) are noticed.
  std::vector<std::string> jit_dir_entries() {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(jit_cache_dir())) {
      const std::string name = e.path().filename().string();
      if (name.rfind(".lock-", 0) != 0) names.push_back(name);  // build locks stay, by design
    }
    return names;
  }
  std::string base_name(const std::string& path) {
    return std::filesystem::path(path).filename().string();
  }
  void expect_sound_entry(const std::string& dir) {
    const std::string so = read_text(dir + "/module.so");
    EXPECT_GT(so.size(), 1000u);
    EXPECT_EQ(so.substr(0, 4), "\x7f" "ELF");
    EXPECT_EQ(trim(read_text(dir + "/module.sha256")), sha256_hex(so));
  }

  TempDir dir_;
  ScopedEnv cache_dir_{"PRIMUS_TURBO_CACHE_DIR", dir_.path()};
  ScopedEnv kernels_{"PRIMUS_TURBO_KERNEL_INCLUDE", PT_TEST_KERNEL_INCLUDE};
  ScopedEnv cutlass_{"PRIMUS_TURBO_CUTLASS_INCLUDE", nullptr};
};

TEST(ParseNvccRelease, ReadsMajorAndMinor) {
  int major = 0, minor = 0;
  ASSERT_TRUE(parse_nvcc_release("Cuda compilation tools, release 13.0, V13.0.88", &major, &minor));
  EXPECT_EQ(major, 13);
  EXPECT_EQ(minor, 0);
  ASSERT_TRUE(parse_nvcc_release("nvcc: NVIDIA (R) Cuda compiler driver\n"
                                 "Cuda compilation tools, release 12.4, V12.4.131\n"
                                 "Build cuda_12.4.r12.4/compiler.34097967_0\n",
                                 &major, &minor));
  EXPECT_EQ(major, 12);
  EXPECT_EQ(minor, 4);
}

TEST(ParseNvccRelease, RejectsTextWithoutARelease) {
  int major = -1, minor = -1;
  EXPECT_FALSE(parse_nvcc_release("command not found", &major, &minor));
  EXPECT_FALSE(parse_nvcc_release("release x.y", &major, &minor));
  EXPECT_EQ(major, -1);
  EXPECT_EQ(minor, -1);
}

TEST_F(JitRuntime, ModuleKeyIsDeterministicAndCoversSourceAndArch) {
  const ModuleRequest r = tiny_module("key");
  const std::string key = module_key(r);
  ASSERT_EQ(key.size(), 64u);
  EXPECT_EQ(key.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(module_key(r), key);
  EXPECT_EQ(module_key(tiny_module("key")), key);

  EXPECT_NE(module_key(tiny_module("key", 43)), key);
  ModuleRequest spaced = r;
  spaced.source += " ";
  EXPECT_NE(module_key(spaced), key);
  ModuleRequest other_arch = r;
  other_arch.arch = "100a";
  EXPECT_NE(module_key(other_arch), key);

  // Locations are not part of the content address.
  TempDir elsewhere;
  ScopedEnv moved("PRIMUS_TURBO_CACHE_DIR", elsewhere.path());
  EXPECT_EQ(module_key(r), key);
}

TEST_F(JitRuntime, CutlassModulesKeyOnTheCutlassVersion) {
  ModuleRequest r = tiny_module("cutlass");
  r.needs_cutlass = true;
  const auto unset = error_of([&] { module_key(r); });
  EXPECT_EQ(unset.status(), PT_ERROR_JIT);
  EXPECT_THAT(unset.what(), HasSubstr("PRIMUS_TURBO_CUTLASS_INCLUDE"));

  TempDir cutlass;
  ScopedEnv include("PRIMUS_TURBO_CUTLASS_INCLUDE", cutlass.path());
  EXPECT_THAT(error_of([&] { module_key(r); }).what(), HasSubstr("cutlass/version.h"));

  std::filesystem::create_directory(cutlass.path() + "/cutlass");
  write_text(cutlass.path() + "/cutlass/version.h", "#define CUTLASS_MAJOR 4\n");
  const std::string v4 = module_key(r);
  EXPECT_NE(v4, module_key(tiny_module("cutlass")));
  write_text(cutlass.path() + "/cutlass/version.h", "#define CUTLASS_MAJOR 5\n");
  EXPECT_NE(module_key(r), v4);
}

TEST_F(JitRuntime, BuildsOnceThenServesFromMemory) {
  const ModuleRequest r = tiny_module(fresh_tag("build-once"));
  const Stats before = stats();
  const auto module = get_module(r);
  const Stats after = stats();
  EXPECT_EQ(after.compiled, before.compiled + 1);
  EXPECT_EQ(after.loaded_from_disk, before.loaded_from_disk);
  EXPECT_EQ(module->function<AnswerFn>("pt_test_answer")(), 42);

  const std::string entry = entry_dir(r);
  EXPECT_EQ(module->path(), entry + "/module.so");
  expect_sound_entry(entry);
  EXPECT_TRUE(std::filesystem::exists(entry + "/build.log"));
  EXPECT_THAT(jit_dir_entries(), ElementsAre(base_name(entry)));

  const auto again = get_module(r);
  EXPECT_EQ(again.get(), module.get());
  EXPECT_EQ(stats().compiled, after.compiled);
  EXPECT_EQ(stats().loaded_from_disk, after.loaded_from_disk);

  const auto missing = error_of([&] { module->symbol("pt_test_missing"); });
  EXPECT_EQ(missing.status(), PT_ERROR_JIT);
  EXPECT_THAT(missing.what(), HasSubstr("no symbol 'pt_test_missing'"));
}

TEST_F(JitRuntime, CompileErrorCarriesTheCompilerOutput) {
  ModuleRequest r;
  r.name = "pt_test_broken";
  r.source = "int pt_test_value = pt_test_undefined_identifier;\n// " + fresh_tag("broken") + "\n";
  const Stats before = stats();
  const auto e = error_of([&] { get_module(r); });
  EXPECT_EQ(e.status(), PT_ERROR_JIT);
  EXPECT_THAT(e.what(), HasSubstr("JIT compilation failed"));
  EXPECT_THAT(e.what(), HasSubstr("pt_test_undefined_identifier"));  // from nvcc's diagnostic
  EXPECT_EQ(stats().compiled, before.compiled);
  EXPECT_THAT(jit_dir_entries(), IsEmpty());  // the private build directory is removed

  // The failure is not remembered as a build in flight: asking again tries (and fails) again.
  EXPECT_EQ(error_of([&] { get_module(r); }).status(), PT_ERROR_JIT);
}

TEST_F(JitRuntime, ConcurrentRequestsForOneNewModuleCompileOnce) {
  const ModuleRequest r = tiny_module(fresh_tag("concurrent"), 7);
  constexpr int kThreads = 8;
  std::promise<void> go;
  std::shared_future<void> start = go.get_future().share();
  std::vector<std::shared_ptr<const Module>> got(kThreads);
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  const Stats before = stats();
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      start.wait();
      try {
        got[i] = get_module(r);
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  }
  go.set_value();
  for (auto& t : threads) t.join();

  const Stats after = stats();
  EXPECT_EQ(after.compiled, before.compiled + 1);
  EXPECT_EQ(after.loaded_from_disk, before.loaded_from_disk);
  for (int i = 0; i < kThreads; ++i) {
    ASSERT_EQ(errors[i], "") << "thread " << i;
    ASSERT_NE(got[i], nullptr);
    EXPECT_EQ(got[i].get(), got[0].get()) << "thread " << i;
  }
  EXPECT_EQ(got[0]->function<AnswerFn>("pt_test_answer")(), 7);
  EXPECT_THAT(jit_dir_entries(), ElementsAre(base_name(entry_dir(r))));
}

// The in-memory registry keeps what a process built, so reading the disk cache takes a fresh
// process: pt_test_jit_child asks for the module and prints the runtime's stats. This process
// never loads the module, so the child may corrupt it in place without pulling it from under us.
TEST_F(JitRuntime, NewProcessReusesThePublishedModuleAndRebuildsACorruptOne) {
  const std::string tag = fresh_tag("cross-process");
  const ModuleRequest r = tiny_module(tag);
  const std::string entry = entry_dir(r);
  const std::string child = shell_quote(PT_TEST_JIT_CHILD) + " " + shell_quote(tag);
  std::string out;

  ASSERT_EQ(run_command(child, &out), 0) << out;
  EXPECT_EQ(out, "compiled=1 loaded=0 answer=42\n");
  expect_sound_entry(entry);

  ASSERT_EQ(run_command(child, &out), 0) << out;
  EXPECT_EQ(out, "compiled=0 loaded=1 answer=42\n");

  write_text(entry + "/module.so", "garbage where a shared object should be");
  ASSERT_EQ(run_command(child, &out), 0) << out;
  EXPECT_EQ(out, "compiled=1 loaded=0 answer=42\n");
  expect_sound_entry(entry);

  // An entry without its digest (say, half deleted) is not trusted either.
  std::filesystem::remove(entry + "/module.sha256");
  ASSERT_EQ(run_command(child, &out), 0) << out;
  EXPECT_EQ(out, "compiled=1 loaded=0 answer=42\n");
  expect_sound_entry(entry);

  EXPECT_THAT(jit_dir_entries(), ElementsAre(base_name(entry)));  // no .tmp- or .trash- left
}

// Ranks of a job starting with an empty cache: one process compiles the module, the others wait on
// its build lock and load what it published.
TEST_F(JitRuntime, ConcurrentProcessesCompileAModuleOnce) {
  const std::string tag = fresh_tag("concurrent-processes");
  const ModuleRequest r = tiny_module(tag);
  const std::string child = shell_quote(PT_TEST_JIT_CHILD) + " " + shell_quote(tag);
  constexpr int kProcesses = 4;
  std::string script;
  for (int i = 0; i < kProcesses; ++i) script += child + " & ";
  script += "wait";
  std::string out;
  ASSERT_EQ(run_command(script, &out), 0) << out;
  int compiled = 0, loaded = 0;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    if (line == "compiled=1 loaded=0 answer=42") ++compiled;
    else if (line == "compiled=0 loaded=1 answer=42") ++loaded;
    else ADD_FAILURE() << "unexpected child output: " << line;
  }
  EXPECT_EQ(compiled, 1) << out;
  EXPECT_EQ(loaded, kProcesses - 1) << out;
  expect_sound_entry(entry_dir(r));
  EXPECT_THAT(jit_dir_entries(), ElementsAre(base_name(entry_dir(r))));
}

// Modules built ahead of time (at install, or carried from a build host) are loaded from a
// read-only folder without compiling; a corrupt one there is skipped (and built in the user's
// cache), never touched.
TEST_F(JitRuntime, PrebuiltModulesLoadWithoutCompiling) {
  const std::string tag = fresh_tag("prebuilt");
  const ModuleRequest r = tiny_module(tag);
  const std::string child = shell_quote(PT_TEST_JIT_CHILD) + " " + shell_quote(tag);
  std::string out;
  ASSERT_EQ(run_command(child, &out), 0) << out;  // builds into this test's cache
  const std::string built = entry_dir(r);

  TempDir prebuilt;
  const std::string entry = prebuilt.path() + "/" + base_name(built);
  std::filesystem::rename(built, entry);  // now only the prebuilt folder has it
  {
    ScopedEnv dirs("PRIMUS_TURBO_PREBUILT_DIR", "/nonexistent:" + prebuilt.path());
    ASSERT_EQ(run_command(child, &out), 0) << out;
    EXPECT_EQ(out, "compiled=0 loaded=1 answer=42\n");
    EXPECT_FALSE(std::filesystem::exists(built)) << "a prebuilt module is used in place";
    {
      ScopedEnv off("PRIMUS_TURBO_NO_PREBUILT", "1");  // building into a folder: compile anyway
      ASSERT_EQ(run_command(child, &out), 0) << out;
      EXPECT_EQ(out, "compiled=1 loaded=0 answer=42\n");
      std::filesystem::remove_all(built);
    }

    write_text(entry + "/module.so", "not a shared object");
    ASSERT_EQ(run_command(child, &out), 0) << out;
    EXPECT_EQ(out, "compiled=1 loaded=0 answer=42\n");
    EXPECT_EQ(read_text(entry + "/module.so"), "not a shared object") << "the prebuilt folder is read-only";
  }
}

}  // namespace
