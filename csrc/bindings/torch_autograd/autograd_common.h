// What every C++ autograd file here uses: torch's autograd types, and the typed handle of a
// registered op to call from a forward or backward (looked up once per call site).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <optional>

namespace primus_turbo::torch_autograd {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using OptTensor = std::optional<Tensor>;

// The op `name` ("primus_turbo::gemm_fp8_fwd") typed as Sig.
template <class Sig>
c10::TypedOperatorHandle<Sig> op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

// A saved optional tensor (undefined when absent) as the op argument it was.
inline OptTensor present(const Tensor& t) { return t.defined() ? OptTensor(t) : std::nullopt; }

}  // namespace primus_turbo::torch_autograd
