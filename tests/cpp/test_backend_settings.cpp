// Backend names, environment values and the code > environment > autotune priority.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>

#include "dispatch/backend_settings.h"
#include "test_util.h"

namespace {

using namespace primus_turbo;
using pt_test::error_of;
using pt_test::ScopedEnv;
using ::testing::HasSubstr;

constexpr const char* kGemmVar = "PRIMUS_TURBO_GEMM_BACKEND";
constexpr const char* kAutoTuneVar = "PRIMUS_TURBO_AUTO_TUNE";
constexpr int32_t kBf16 = PT_PRECISION_BF16_FP16_FP32;
constexpr int32_t kFp8 = PT_PRECISION_FP8;
constexpr int32_t kFp4 = PT_PRECISION_FP4;

// Every test starts from no code setting and none of the variables it reads.
class BackendSettings : public ::testing::Test {
 protected:
  void SetUp() override { reset_backend_settings(); }
  void TearDown() override { reset_backend_settings(); }

  ScopedEnv gemm_env_{kGemmVar, nullptr};
  ScopedEnv attn_env_{"PRIMUS_TURBO_ATTN_BACKEND", nullptr};
  ScopedEnv auto_tune_env_{kAutoTuneVar, nullptr};
};

BackendChoice env(const std::string& value, int32_t precision) {
  return parse_env_setting(value, precision, kGemmVar);
}

TEST_F(BackendSettings, NvidiaNamesAndAliases) {
  EXPECT_EQ(backend_from_name("CUBLASLT"), PT_BACKEND_CUBLASLT);
  EXPECT_EQ(backend_from_name("CUBLAS"), PT_BACKEND_CUBLASLT);
  EXPECT_EQ(backend_from_name("CUTLASS"), PT_BACKEND_CUTLASS);
  EXPECT_EQ(backend_from_name("DeepEP"), PT_BACKEND_DEEP_EP);
  EXPECT_EQ(backend_from_name("HIPBLASLT"), PT_BACKEND_CUBLASLT);
  EXPECT_EQ(backend_from_name("CK"), PT_BACKEND_CUTLASS);
  EXPECT_EQ(backend_from_name("rccl"), PT_BACKEND_NCCL);
}

TEST_F(BackendSettings, NamesAreCaseInsensitiveAndTrimmed) {
  EXPECT_EQ(backend_from_name("cutlass"), PT_BACKEND_CUTLASS);
  EXPECT_EQ(backend_from_name("  CuBlasLt\t\n"), PT_BACKEND_CUBLASLT);
  EXPECT_EQ(backend_from_name(" ck "), PT_BACKEND_CUTLASS);
}

TEST_F(BackendSettings, EveryBackendNameRoundTrips) {
  for (int32_t b = PT_BACKEND_CUBLASLT; b < PT_NUM_BACKENDS; ++b) {
    EXPECT_EQ(backend_from_name(backend_name(b)), b) << backend_name(b);
  }
  EXPECT_STREQ(backend_name(PT_BACKEND_NONE), "NONE");
  EXPECT_STREQ(backend_name(99), "UNKNOWN");
}

TEST_F(BackendSettings, OriginalAttentionKernelsNameOursForAttentionOnly) {
  for (const char* name : {"CK", "aiter", " Triton ", "CUTLASS"}) {
    SCOPED_TRACE(name);
    EXPECT_EQ(backend_from_name(name, PT_OP_ATTN), PT_BACKEND_TURBO);
  }
  EXPECT_EQ(backend_from_name("CUDNN", PT_OP_ATTN), PT_BACKEND_CUDNN);
  EXPECT_EQ(backend_from_name("CK", PT_OP_GEMM), PT_BACKEND_CUTLASS);
  EXPECT_EQ(error_of([&] { backend_from_name("AITER", PT_OP_GEMM); }).status(), PT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(parse_env_setting("bf16:CK,fp8:cudnn", kBf16, "PRIMUS_TURBO_ATTN_BACKEND", PT_OP_ATTN).backend,
            PT_BACKEND_TURBO);
  ScopedEnv set("PRIMUS_TURBO_ATTN_BACKEND", "triton");
  EXPECT_EQ(env_choice(PT_OP_ATTN, kBf16).backend, PT_BACKEND_TURBO);
}

TEST_F(BackendSettings, AmdOnlyBackendsSayThereIsNoNvidiaEquivalent) {
  for (const char* name : {"AITER", "triton", " Triton "}) {
    SCOPED_TRACE(name);
    const auto e = error_of([&] { backend_from_name(name); });
    EXPECT_EQ(e.status(), PT_ERROR_INVALID_ARGUMENT);
    EXPECT_THAT(e.what(), HasSubstr(std::string("backend '") + name + "'"));
    EXPECT_THAT(e.what(), HasSubstr("no equivalent on NVIDIA GPUs"));
    EXPECT_THAT(e.what(), HasSubstr("CUTLASS"));
  }
}

TEST_F(BackendSettings, UnknownNameListsTheChoices) {
  const auto e = error_of([&] { backend_from_name("FOO"); });
  EXPECT_EQ(e.status(), PT_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(e.what(), HasSubstr("unknown backend 'FOO'"));
  EXPECT_THAT(e.what(), HasSubstr("CUBLASLT, CUTLASS, CUDNN, TURBO, NCCL, DEEP_EP"));
  EXPECT_THAT(e.what(), HasSubstr("HIPBLASLT->CUBLASLT"));
}

TEST_F(BackendSettings, AutotuneIsAChoiceButNotABackend) {
  const BackendChoice c = parse_backend_choice(" autotune ", "test");
  EXPECT_TRUE(c.auto_tune);
  EXPECT_EQ(c.backend, PT_BACKEND_NONE);
  EXPECT_TRUE(parse_backend_choice("AUTO_TUNE", "test").auto_tune);

  const auto e = error_of([&] { parse_backend_choice("bogus", "my context"); });
  EXPECT_THAT(e.what(), HasSubstr("my context: unknown backend 'BOGUS'"));
}

TEST_F(BackendSettings, EnvSingleNameAppliesToEveryPrecision) {
  for (int32_t p : {kBf16, kFp8, kFp4}) {
    const BackendChoice c = env("CUTLASS", p);
    EXPECT_EQ(c.backend, PT_BACKEND_CUTLASS);
    EXPECT_FALSE(c.auto_tune);
  }
  EXPECT_TRUE(env("autotune", kFp8).auto_tune);
}

TEST_F(BackendSettings, EnvPerPrecisionList) {
  const std::string v = "fp8:CUTLASS,bf16:CUBLASLT";
  EXPECT_EQ(env(v, kFp8).backend, PT_BACKEND_CUTLASS);
  EXPECT_EQ(env(v, kBf16).backend, PT_BACKEND_CUBLASLT);
  EXPECT_FALSE(env(v, kFp4).is_set());
  // fp16 and fp32 belong to the bf16 class.
  EXPECT_EQ(env("fp16:cutlass", kBf16).backend, PT_BACKEND_CUTLASS);
  EXPECT_EQ(env("FP32:cutlass", kBf16).backend, PT_BACKEND_CUTLASS);
  EXPECT_EQ(env(" fp8 : ck , fp4:autotune ", kFp8).backend, PT_BACKEND_CUTLASS);
  EXPECT_TRUE(env(" fp8 : ck , fp4:autotune ", kFp4).auto_tune);
}

TEST_F(BackendSettings, EnvOtherIsTheFallbackWhateverItsPosition) {
  for (const std::string v : {"other:CUBLASLT,fp8:CUTLASS", "fp8:CUTLASS,other:CUBLASLT"}) {
    SCOPED_TRACE(v);
    EXPECT_EQ(env(v, kFp8).backend, PT_BACKEND_CUTLASS);
    EXPECT_EQ(env(v, kBf16).backend, PT_BACKEND_CUBLASLT);
    EXPECT_EQ(env(v, kFp4).backend, PT_BACKEND_CUBLASLT);
  }
  EXPECT_TRUE(env("other:autotune", kBf16).auto_tune);
}

TEST_F(BackendSettings, EnvUnknownPrecisionWord) {
  const auto e = error_of([&] { env("fp9:CUTLASS", kFp8); });
  EXPECT_EQ(e.status(), PT_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(e.what(), HasSubstr("PRIMUS_TURBO_GEMM_BACKEND='fp9:CUTLASS'"));
  EXPECT_THAT(e.what(), HasSubstr("unknown precision 'FP9'"));
}

TEST_F(BackendSettings, EnvEntryWithoutColon) {
  const auto e = error_of([&] { env("fp8:CUTLASS,CUBLASLT", kFp8); });
  EXPECT_EQ(e.status(), PT_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(e.what(), HasSubstr("entry 'CUBLASLT' must be <precision>:<backend>"));
}

TEST_F(BackendSettings, EnvBadBackendNamesTheVariable) {
  const auto e = error_of([&] { env("fp8:AITER", kBf16); });
  EXPECT_EQ(e.status(), PT_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(e.what(), HasSubstr("PRIMUS_TURBO_GEMM_BACKEND='fp8:AITER'"));
  EXPECT_THAT(e.what(), HasSubstr("no equivalent on NVIDIA GPUs"));
  EXPECT_THAT(error_of([&] { env("nope", kBf16); }).what(),
              HasSubstr("PRIMUS_TURBO_GEMM_BACKEND='nope': unknown backend"));
}

TEST_F(BackendSettings, EnvChoiceReadsTheOpFamilysVariable) {
  EXPECT_FALSE(env_choice(PT_OP_GEMM, kBf16).is_set());
  ScopedEnv set(kGemmVar, "fp8:CUTLASS");
  EXPECT_EQ(env_choice(PT_OP_GEMM, kFp8).backend, PT_BACKEND_CUTLASS);
  EXPECT_FALSE(env_choice(PT_OP_GEMM, kBf16).is_set());
  EXPECT_FALSE(env_choice(PT_OP_ATTN, kFp8).is_set());
  ScopedEnv blank(kGemmVar, "   ");
  EXPECT_FALSE(env_choice(PT_OP_GEMM, kFp8).is_set());
}

TEST_F(BackendSettings, PriorityIsCodeThenEnvThenAutotune) {
  EXPECT_FALSE(resolve_choice(PT_OP_GEMM, kBf16).is_set());

  auto auto_tune = std::make_unique<ScopedEnv>(kAutoTuneVar, "1");
  BackendChoice c = resolve_choice(PT_OP_GEMM, kBf16);
  EXPECT_EQ(c.backend, PT_BACKEND_NONE);
  EXPECT_TRUE(c.auto_tune);

  auto gemm = std::make_unique<ScopedEnv>(kGemmVar, "CUBLASLT");
  c = resolve_choice(PT_OP_GEMM, kBf16);
  EXPECT_EQ(c.backend, PT_BACKEND_CUBLASLT);
  EXPECT_FALSE(c.auto_tune);  // a fixed backend from the environment beats global autotune

  set_code_choice(PT_OP_GEMM, -1, BackendChoice{PT_BACKEND_CUTLASS, false});
  c = resolve_choice(PT_OP_GEMM, kBf16);
  EXPECT_EQ(c.backend, PT_BACKEND_CUTLASS);
  EXPECT_FALSE(c.auto_tune);

  // A code request to autotune beats a backend fixed by the environment.
  set_code_choice(PT_OP_GEMM, -1, BackendChoice{PT_BACKEND_NONE, true});
  c = resolve_choice(PT_OP_GEMM, kBf16);
  EXPECT_EQ(c.backend, PT_BACKEND_NONE);
  EXPECT_TRUE(c.auto_tune);

  set_code_choice(PT_OP_GEMM, -1, BackendChoice{});  // clears the code setting
  EXPECT_EQ(resolve_choice(PT_OP_GEMM, kBf16).backend, PT_BACKEND_CUBLASLT);

  gemm.reset();
  EXPECT_TRUE(resolve_choice(PT_OP_GEMM, kBf16).auto_tune);
  auto_tune.reset();
  EXPECT_FALSE(resolve_choice(PT_OP_GEMM, kBf16).is_set());
}

TEST_F(BackendSettings, CodeChoiceIsPerOpAndPrecision) {
  ScopedEnv gemm(kGemmVar, "CUBLASLT");
  set_code_choice(PT_OP_GEMM, kFp8, BackendChoice{PT_BACKEND_CUTLASS, false});
  EXPECT_EQ(code_choice(PT_OP_GEMM, kFp8).backend, PT_BACKEND_CUTLASS);
  EXPECT_FALSE(code_choice(PT_OP_GEMM, kBf16).is_set());
  EXPECT_FALSE(code_choice(PT_OP_GROUPED_GEMM, kFp8).is_set());
  EXPECT_EQ(resolve_choice(PT_OP_GEMM, kFp8).backend, PT_BACKEND_CUTLASS);
  EXPECT_EQ(resolve_choice(PT_OP_GEMM, kBf16).backend, PT_BACKEND_CUBLASLT);
}

TEST_F(BackendSettings, AutoTuneEnvironmentValues) {
  for (const char* on : {"1", "true", "ON", " yes "}) {
    ScopedEnv v(kAutoTuneVar, on);
    EXPECT_TRUE(auto_tune_enabled()) << on;
  }
  for (const char* off : {"0", "False", "off", "NO"}) {
    ScopedEnv v(kAutoTuneVar, off);
    EXPECT_FALSE(auto_tune_enabled()) << off;
  }
  EXPECT_FALSE(auto_tune_enabled());  // unset
}

TEST_F(BackendSettings, BadAutoTuneValueIsAnError) {
  ScopedEnv v(kAutoTuneVar, "maybe");
  const auto e = error_of([&] { auto_tune_enabled(); });
  EXPECT_EQ(e.status(), PT_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(e.what(), HasSubstr("PRIMUS_TURBO_AUTO_TUNE='maybe'"));
  EXPECT_THAT(error_of([&] { resolve_choice(PT_OP_GEMM, kBf16); }).what(),
              HasSubstr("PRIMUS_TURBO_AUTO_TUNE='maybe'"));
  // A setting that decides before autotune is consulted does not trip over it.
  set_code_choice(PT_OP_GEMM, -1, BackendChoice{PT_BACKEND_CUTLASS, false});
  EXPECT_EQ(resolve_choice(PT_OP_GEMM, kBf16).backend, PT_BACKEND_CUTLASS);
}

TEST_F(BackendSettings, AutoTuneCodeSettingOverridesEnvironment) {
  ScopedEnv v(kAutoTuneVar, "1");
  set_auto_tune_code(false);
  EXPECT_FALSE(auto_tune_enabled());
  EXPECT_FALSE(resolve_choice(PT_OP_GEMM, kBf16).auto_tune);
  set_auto_tune_code(std::nullopt);
  EXPECT_TRUE(auto_tune_enabled());

  ScopedEnv off(kAutoTuneVar, "0");
  set_auto_tune_code(true);
  EXPECT_TRUE(resolve_choice(PT_OP_GEMM, kBf16).auto_tune);
}

TEST_F(BackendSettings, ResetClearsCodeSettings) {
  set_code_choice(PT_OP_GEMM, -1, BackendChoice{PT_BACKEND_CUTLASS, false});
  set_code_choice(PT_OP_ATTN, kFp8, BackendChoice{PT_BACKEND_NONE, true});
  set_auto_tune_code(true);
  reset_backend_settings();
  for (int32_t op = 0; op < PT_NUM_OP_FAMILIES; ++op) {
    for (int32_t p = 0; p < PT_NUM_PRECISIONS; ++p) {
      EXPECT_FALSE(code_choice(op, p).is_set()) << op << "/" << p;
    }
  }
  EXPECT_FALSE(auto_tune_enabled());
}

TEST_F(BackendSettings, SetCodeChoiceRejectsBackendWithAutoTune) {
  set_code_choice(PT_OP_GEMM, kBf16, BackendChoice{PT_BACKEND_CUBLASLT, false});
  const auto e =
      error_of([&] { set_code_choice(PT_OP_GEMM, kBf16, BackendChoice{PT_BACKEND_CUTLASS, true}); });
  EXPECT_EQ(e.status(), PT_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(e.what(), HasSubstr("exclude each other"));
  EXPECT_EQ(code_choice(PT_OP_GEMM, kBf16).backend, PT_BACKEND_CUBLASLT);  // unchanged
  EXPECT_FALSE(code_choice(PT_OP_GEMM, kBf16).auto_tune);
}

TEST_F(BackendSettings, SetCodeChoiceRejectsOutOfRangeCodes) {
  EXPECT_THAT(error_of([&] { set_code_choice(PT_OP_GEMM, kBf16, BackendChoice{99, false}); }).what(),
              HasSubstr("backend code 99 is out of range"));
  EXPECT_THAT(error_of([&] { set_code_choice(PT_OP_GEMM, kBf16, BackendChoice{-1, false}); }).what(),
              HasSubstr("backend code -1 is out of range"));
  EXPECT_THAT(error_of([&] { set_code_choice(PT_NUM_OP_FAMILIES, kBf16, BackendChoice{}); }).what(),
              HasSubstr("op family code 4 is out of range"));
  EXPECT_THAT(error_of([&] { set_code_choice(PT_OP_GEMM, PT_NUM_PRECISIONS, BackendChoice{}); }).what(),
              HasSubstr("precision code 3 is out of range"));
  EXPECT_THAT(error_of([&] { code_choice(PT_OP_GEMM, -1); }).what(),
              HasSubstr("precision code -1 is out of range"));
}

// The C API wraps the same logic and reports errors through pt_last_error.
TEST_F(BackendSettings, CApiReportsStatusAndMessage) {
  int32_t backend = -1, auto_tune = -1;
  ASSERT_EQ(pt_backend_from_name("ck", &backend), PT_SUCCESS);
  EXPECT_EQ(backend, PT_BACKEND_CUTLASS);
  EXPECT_STREQ(pt_last_error(), "");

  EXPECT_EQ(pt_backend_from_name("AITER", &backend), PT_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(pt_last_error(), HasSubstr("no equivalent on NVIDIA GPUs"));

  EXPECT_EQ(pt_backend_set(PT_OP_GEMM, -1, PT_BACKEND_CUTLASS, 1), PT_ERROR_INVALID_ARGUMENT);
  ASSERT_EQ(pt_backend_set(PT_OP_GEMM, kFp8, PT_BACKEND_CUTLASS, 0), PT_SUCCESS);
  ASSERT_EQ(pt_backend_resolve(PT_OP_GEMM, kFp8, &backend, &auto_tune), PT_SUCCESS);
  EXPECT_EQ(backend, PT_BACKEND_CUTLASS);
  EXPECT_EQ(auto_tune, 0);
  ASSERT_EQ(pt_backend_reset(), PT_SUCCESS);
  ASSERT_EQ(pt_backend_get_code(PT_OP_GEMM, kFp8, &backend, &auto_tune), PT_SUCCESS);
  EXPECT_EQ(backend, PT_BACKEND_NONE);

  ScopedEnv bad(kGemmVar, "fp8:nope");
  EXPECT_EQ(pt_backend_get_env(PT_OP_GEMM, kFp8, &backend, &auto_tune), PT_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(pt_last_error(), HasSubstr("unknown backend 'NOPE'"));
}

}  // namespace
