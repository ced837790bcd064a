// Which implementation an operator family uses, per precision.
//
// Priority, highest first: the code setting (pt_backend_set) > the environment
// (PRIMUS_TURBO_<OP>_BACKEND) > autotune (code setting, else PRIMUS_TURBO_AUTO_TUNE) > the
// operator's default > any backend that accepts the inputs. This file resolves the first three;
// the operator's dispatcher applies the last two, since only it knows what accepts its inputs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "primus_turbo/primus_turbo.h"

namespace primus_turbo {

struct BackendChoice {
  int32_t backend = PT_BACKEND_NONE;
  bool auto_tune = false;
  bool is_set() const { return backend != PT_BACKEND_NONE || auto_tune; }
};

// "CUTLASS", "cublaslt", "HIPBLASLT" (-> CUBLASLT), "CK" (-> CUTLASS), "AUTOTUNE" (-> auto_tune).
// For the attention family (op = PT_OP_ATTN) the original library's attention kernels CK, AITER and
// TRITON, and CUTLASS, name our own kernel, TURBO. Throws PT_ERROR_INVALID_ARGUMENT naming the value and the
// accepted names.
BackendChoice parse_backend_choice(const std::string& name, const char* context, int32_t op = -1);
int32_t backend_from_name(const std::string& name, int32_t op = -1);
const char* backend_name(int32_t backend);
const char* op_family_env_var(int32_t op);

// Parses an environment value: "NAME" for every precision, or "fp8:CUTLASS,bf16:CUBLASLT,
// other:AUTOTUNE" per precision (bf16, fp16 and fp32 share one precision class).
BackendChoice parse_env_setting(const std::string& value, int32_t precision, const char* env_var,
                                int32_t op = -1);

void set_code_choice(int32_t op, int32_t precision, BackendChoice choice);  // precision<0: all
BackendChoice code_choice(int32_t op, int32_t precision);
BackendChoice env_choice(int32_t op, int32_t precision);
void set_auto_tune_code(std::optional<bool> enabled);
bool auto_tune_enabled();
BackendChoice resolve_choice(int32_t op, int32_t precision);
void reset_backend_settings();

// The settings epoch (pt_settings_epoch): bumped by every change of a code setting.
uint64_t settings_epoch();
void touch_settings();

}  // namespace primus_turbo
