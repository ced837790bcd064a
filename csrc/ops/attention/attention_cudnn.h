// The CUDNN attention backend: cuDNN's fused flash attention, through graphs of the cuDNN frontend
// built once per problem shape and cached. libcudnn is opened at run time (the one the framework
// already loaded, when there is one), so the library neither links nor ships it.
#pragma once

#include <cstddef>
#include <string>

#include "ops/attention/attention_problem.h"

namespace primus_turbo::attention::cudnn {

// A built cuDNN graph for one problem shape and direction (owned by the cache, never freed).
struct Plan;

// The graph for this problem, built on first use (host work: make the first call of a shape
// outside a CUDA-graph capture); null when cuDNN cannot run it, with the reason in
// *why (packed sequences with separate lengths for q and k, a row that sees no key, a shape
// cuDNN's engines refuse, no libcudnn).
// backward: the gradient graph; deterministic: its bitwise-reproducible variant.
const Plan* plan_for(const Problem& p, bool backward, bool deterministic, std::string* why);

// cuDNN's workspace, and for packed sequences the scratch of their metadata.
size_t workspace_bytes(const Plan& plan, const Problem& p);

// Compiles (or loads) the packed-sequence metadata module the graphs of packed problems use.
void prepare_ragged_metadata(const std::string& arch);

// Runs the graph on p's tensors (the backward's too when the plan is a backward one).
void execute(const Plan& plan, const Problem& p, void* workspace, void* stream);

}  // namespace primus_turbo::attention::cudnn
