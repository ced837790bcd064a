#include "dispatch/backend_settings.h"

#include <array>
#include <atomic>
#include <mutex>
#include <sstream>

#include "core/env.h"
#include "core/error.h"

namespace primus_turbo {

namespace {

struct NameEntry {
  const char* name;
  int32_t backend;
};

// NVIDIA names, then the original library's AMD names that have a natural equivalent here.
constexpr NameEntry kNames[] = {
    {"CUBLASLT", PT_BACKEND_CUBLASLT}, {"CUBLAS", PT_BACKEND_CUBLASLT},
    {"CUTLASS", PT_BACKEND_CUTLASS},   {"CUDNN", PT_BACKEND_CUDNN},
    {"TURBO", PT_BACKEND_TURBO},       {"NCCL", PT_BACKEND_NCCL},
    {"DEEP_EP", PT_BACKEND_DEEP_EP},   {"DEEPEP", PT_BACKEND_DEEP_EP},
    {"HIPBLASLT", PT_BACKEND_CUBLASLT}, {"CK", PT_BACKEND_CUTLASS},
    {"RCCL", PT_BACKEND_NCCL},
};

// AMD backends with no counterpart on this GPU: rejected with an explanation.
constexpr const char* kAmdOnly[] = {"AITER", "TRITON", "FLYDSL", "HIPKITTENS"};

// The original library's attention kernels (composable-kernel, AITER and Triton flash attention):
// for the attention family they stand for our own attention kernel, and so does CUTLASS (CK's
// alias elsewhere; our attention kernel is written with CuTe).
constexpr const char* kAttentionAliases[] = {"CK", "AITER", "TRITON", "CUTLASS"};

std::mutex g_mutex;
std::array<std::array<BackendChoice, PT_NUM_PRECISIONS>, PT_NUM_OP_FAMILIES> g_code{};
std::optional<bool> g_auto_tune_code;

void check_op(int32_t op) {
  PT_CHECK_ARG(op >= 0 && op < PT_NUM_OP_FAMILIES, "op family code ", op, " is out of range [0, ",
               int(PT_NUM_OP_FAMILIES), ")");
}
void check_precision(int32_t p) {
  PT_CHECK_ARG(p >= 0 && p < PT_NUM_PRECISIONS, "precision code ", p, " is out of range [0, ",
               int(PT_NUM_PRECISIONS), ")");
}

std::string accepted_names() {
  return "CUBLASLT, CUTLASS, CUDNN, TURBO, NCCL, DEEP_EP or AUTOTUNE (aliases: HIPBLASLT->CUBLASLT, "
         "CK->CUTLASS, RCCL->NCCL)";
}

// Precision words in an environment value and the class each maps to.
std::optional<int32_t> precision_from_word(const std::string& w) {
  if (w == "BF16" || w == "FP16" || w == "FP32" || w == "BF16_FP16_FP32") {
    return PT_PRECISION_BF16_FP16_FP32;
  }
  if (w == "FP8") return PT_PRECISION_FP8;
  if (w == "FP4") return PT_PRECISION_FP4;
  return std::nullopt;
}

}  // namespace

int32_t backend_from_name(const std::string& raw, int32_t op) {
  const std::string name = to_upper(trim(raw));
  if (op == PT_OP_ATTN) {
    for (const char* alias : kAttentionAliases) {
      if (name == alias) return PT_BACKEND_TURBO;
    }
  }
  for (const auto& e : kNames) {
    if (name == e.name) return e.backend;
  }
  for (const char* amd : kAmdOnly) {
    PT_CHECK_ARG(name != amd, "backend '", raw, "' is an AMD ROCm backend with no equivalent on ",
                 "NVIDIA GPUs; choose one of ", accepted_names());
  }
  PT_THROW(PT_ERROR_INVALID_ARGUMENT, "unknown backend '", raw, "'; choose one of ",
           accepted_names());
}

const char* backend_name(int32_t backend) {
  switch (backend) {
    case PT_BACKEND_NONE: return "NONE";
    case PT_BACKEND_CUBLASLT: return "CUBLASLT";
    case PT_BACKEND_CUTLASS: return "CUTLASS";
    case PT_BACKEND_CUDNN: return "CUDNN";
    case PT_BACKEND_TURBO: return "TURBO";
    case PT_BACKEND_NCCL: return "NCCL";
    case PT_BACKEND_DEEP_EP: return "DEEP_EP";
    default: return "UNKNOWN";
  }
}

const char* op_family_env_var(int32_t op) {
  switch (op) {
    case PT_OP_GEMM: return "PRIMUS_TURBO_GEMM_BACKEND";
    case PT_OP_GROUPED_GEMM: return "PRIMUS_TURBO_GROUPED_GEMM_BACKEND";
    case PT_OP_ATTN: return "PRIMUS_TURBO_ATTN_BACKEND";
    case PT_OP_MOE_DISPATCH_COMBINE: return "PRIMUS_TURBO_MOE_DISPATCH_COMBINE_BACKEND";
    default: PT_THROW(PT_ERROR_INVALID_ARGUMENT, "op family code ", op, " is out of range");
  }
}

BackendChoice parse_backend_choice(const std::string& raw, const char* context, int32_t op) {
  const std::string name = to_upper(trim(raw));
  BackendChoice c;
  if (name == "AUTOTUNE" || name == "AUTO_TUNE") {
    c.auto_tune = true;
    return c;
  }
  try {
    c.backend = backend_from_name(name, op);
  } catch (const Error& e) {
    PT_THROW(PT_ERROR_INVALID_ARGUMENT, context, ": ", e.what());
  }
  return c;
}

BackendChoice parse_env_setting(const std::string& value, int32_t precision, const char* env_var, int32_t op) {
  check_precision(precision);
  const std::string context = str_cat("environment variable ", env_var, "='", value, "'");
  if (value.find(':') == std::string::npos) return parse_backend_choice(value, context.c_str(), op);
  BackendChoice mine, other;
  bool have_mine = false;
  std::stringstream ss(value);
  std::string item;
  while (std::getline(ss, item, ',')) {
    item = trim(item);
    if (item.empty()) continue;
    const auto colon = item.find(':');
    PT_CHECK_ARG(colon != std::string::npos, context, ": entry '", item,
                 "' must be <precision>:<backend>, e.g. fp8:CUTLASS");
    const std::string word = to_upper(trim(item.substr(0, colon)));
    const BackendChoice choice = parse_backend_choice(item.substr(colon + 1), context.c_str(), op);
    if (word == "OTHER") {
      other = choice;
      continue;
    }
    auto p = precision_from_word(word);
    PT_CHECK_ARG(p.has_value(), context, ": unknown precision '", word,
                 "'; expected bf16, fp16, fp32, fp8, fp4 or other");
    if (*p == precision) {
      mine = choice;
      have_mine = true;
    }
  }
  return have_mine ? mine : other;
}

void set_code_choice(int32_t op, int32_t precision, BackendChoice choice) {
  check_op(op);
  if (choice.backend != PT_BACKEND_NONE) {
    PT_CHECK_ARG(choice.backend > 0 && choice.backend < PT_NUM_BACKENDS, "backend code ",
                 choice.backend, " is out of range");
    PT_CHECK_ARG(!choice.auto_tune, "auto_tune=True needs backend=None: a fixed backend and ",
                 "autotuning exclude each other");
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  if (precision < 0) {
    g_code[op].fill(choice);
  } else {
    check_precision(precision);
    g_code[op][precision] = choice;
  }
}

BackendChoice code_choice(int32_t op, int32_t precision) {
  check_op(op);
  check_precision(precision);
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_code[op][precision];
}

BackendChoice env_choice(int32_t op, int32_t precision) {
  const char* var = op_family_env_var(op);
  auto value = env_value(var);
  if (!value) return BackendChoice{};
  return parse_env_setting(*value, precision, var, op);
}

void set_auto_tune_code(std::optional<bool> enabled) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_auto_tune_code = enabled;
}

bool auto_tune_enabled() {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_auto_tune_code.has_value()) return *g_auto_tune_code;
  }
  auto v = env_value("PRIMUS_TURBO_AUTO_TUNE");
  if (!v) return false;
  const std::string s = to_upper(*v);
  if (s == "1" || s == "TRUE" || s == "ON" || s == "YES") return true;
  if (s == "0" || s == "FALSE" || s == "OFF" || s == "NO") return false;
  PT_THROW(PT_ERROR_INVALID_ARGUMENT, "environment variable PRIMUS_TURBO_AUTO_TUNE='", *v,
           "' must be 1/0, true/false, on/off or yes/no");
}

BackendChoice resolve_choice(int32_t op, int32_t precision) {
  BackendChoice c = code_choice(op, precision);
  if (c.is_set()) return c;
  c = env_choice(op, precision);
  if (c.is_set()) return c;
  c.auto_tune = auto_tune_enabled();
  return c;
}

void reset_backend_settings() {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (auto& row : g_code) row.fill(BackendChoice{});
  g_auto_tune_code.reset();
}

namespace {
std::atomic<uint64_t> g_settings_epoch{1};
}  // namespace

uint64_t settings_epoch() { return g_settings_epoch.load(std::memory_order_acquire); }

void touch_settings() { g_settings_epoch.fetch_add(1, std::memory_order_acq_rel); }

}  // namespace primus_turbo
