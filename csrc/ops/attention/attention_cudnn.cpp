#include "ops/attention/attention_cudnn.h"

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "runtime/device.h"

#if PT_HAVE_CUDNN_FRONTEND
#include <dlfcn.h>

#include <cudnn_frontend.h>

// The frontend's dynamic-loading shim resolves every cuDNN entry point through this handle.
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}
#endif

namespace primus_turbo::attention::cudnn {

#if !PT_HAVE_CUDNN_FRONTEND

struct Plan {};

const Plan* plan_for(const Problem&, bool, bool, std::string* why) {
  *why = "this build has no cuDNN frontend headers (install nvidia-cudnn-frontend and rebuild)";
  return nullptr;
}
size_t workspace_bytes(const Plan&) { return 0; }
void execute(const Plan&, const Problem&, void*, void*) {
  PT_THROW(PT_ERROR_NOT_SUPPORTED, "the CUDNN attention backend is not built");
}

#else

namespace fe = cudnn_frontend;

namespace {

enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kSink, kDout, kDq, kDk, kDv, kDsink };

std::mutex g_mutex;  // the cache, the handles and their streams

// Opens libcudnn once: by soname first (a framework that links cuDNN has it loaded already).
const std::string& load_error() {
  static const std::string error = [] {
    for (const char* name : {"libcudnn.so.9", "libcudnn.so"}) {
      if (void* h = dlopen(name, RTLD_NOW | RTLD_GLOBAL)) {
        fe::cudnn_dlhandle = h;
        const size_t version = fe::detail::get_backend_version();
        if (version < 91000) return str_cat("cuDNN ", version, " is too old (9.10 or newer is needed)");
        return std::string();
      }
    }
    const char* e = dlerror();
    return str_cat("libcudnn.so.9 could not be loaded (", e ? e : "not found", ")");
  }();
  return error;
}

cudnnHandle_t handle_for(int device) {
  static std::map<int, cudnnHandle_t> handles;
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  cudnnHandle_t h = nullptr;
  const cudnnStatus_t s = fe::detail::create_handle(&h);
  PT_CHECK_SUPPORTED(s == CUDNN_STATUS_SUCCESS, "cudnnCreate failed with status ", int(s));
  handles.emplace(device, h);
  return h;
}

struct Dims {  // one [B, S, H, D] operand as cuDNN's [B, H, S, D] with its strides
  int64_t heads, seq, dim, sb, ss, sh;
};

std::shared_ptr<fe::graph::Tensor_attributes> operand(fe::graph::Graph& g, const char* name, Uid uid, int64_t batch,
                                                      const Dims& d) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({batch, d.heads, d.seq, d.dim})
                      .set_stride({d.sb, d.sh, d.ss, 1}));
}

void set_output(const std::shared_ptr<fe::graph::Tensor_attributes>& t, Uid uid, int64_t batch, const Dims& d) {
  t->set_output(true).set_uid(uid).set_dim({batch, d.heads, d.seq, d.dim}).set_stride({d.sb, d.sh, d.ss, 1});
}

std::shared_ptr<fe::graph::Tensor_attributes> per_head(fe::graph::Graph& g, const char* name, Uid uid, int64_t heads) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({1, heads, 1, 1})
                      .set_stride({heads, 1, 1, 1})
                      .set_data_type(fe::DataType_t::FLOAT));
}

// The window sides that constrain something (-1 otherwise): a left side of at least Sk - 1 or a
// right side of at least Sq - 1 hides no key of any row.
struct Window {
  int64_t left, right;
};
Window effective_window(const PtAttnParams& r) {
  return {r.window_left >= r.seqlen_k - 1 ? -1 : r.window_left, r.window_right >= r.seqlen_q - 1 ? -1 : r.window_right};
}

// Our window rule (key j visible from query i iff i + Sk - Sq - left <= j <= i + Sk - Sq + right) in
// cuDNN's terms: a band around the bottom-right diagonal whose left bound is exclusive.
template <class Attributes>
void set_mask(Attributes& a, const PtAttnParams& r) {
  const Window w = effective_window(r);
  if (w.right < 0) return;  // plan_for refused a left window without a right one
  a.set_diagonal_alignment(r.seqlen_q == r.seqlen_k ? fe::DiagonalAlignment_t::TOP_LEFT
                                                    : fe::DiagonalAlignment_t::BOTTOM_RIGHT);
  a.set_diagonal_band_right_bound(static_cast<int>(w.right));
  if (w.left >= 0) a.set_diagonal_band_left_bound(static_cast<int>(w.left + 1));
}

std::shared_ptr<fe::graph::Graph> build_graph(const Problem& p, bool backward, bool deterministic) {
  const PtAttnParams& r = p.params;
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(p.dtype == PT_BFLOAT16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const int64_t b = r.batch;
  const Dims q{r.heads_q, r.seqlen_q, r.head_dim, r.q_sb, r.q_ss, r.q_sh};
  const Dims k{r.heads_kv, r.seqlen_k, r.head_dim, r.k_sb, r.k_ss, r.k_sh};
  const Dims v{r.heads_kv, r.seqlen_k, r.head_dim_v, r.v_sb, r.v_ss, r.v_sh};
  const Dims o{r.heads_q, r.seqlen_q, r.head_dim_v, r.o_sb, r.o_ss, r.o_sh};
  const Dims stats{r.heads_q, r.seqlen_q, 1, r.lse_sb, 1, r.lse_sh};
  auto Q = operand(*g, "q", kQ, b, q), K = operand(*g, "k", kK, b, k), V = operand(*g, "v", kV, b, v);
  if (!backward) {
    auto a = fe::graph::SDPA_attributes().set_name("attention").set_generate_stats(true).set_attn_scale(
        r.softmax_scale);
    set_mask(a, r);
    if (r.sink != nullptr) a.set_sink_token(per_head(*g, "sink", kSink, r.heads_q));
    auto [O, Stats] = g->sdpa(Q, K, V, a);
    set_output(O, kO, b, o);
    set_output(Stats, kStats, b, stats);
    Stats->set_data_type(fe::DataType_t::FLOAT);
    return g;
  }
  const Dims dout{r.heads_q, r.seqlen_q, r.head_dim_v, r.do_sb, r.do_ss, r.do_sh};
  auto O = operand(*g, "out", kO, b, o), dO = operand(*g, "dout", kDout, b, dout);
  auto Stats = operand(*g, "lse", kStats, b, stats);
  Stats->set_data_type(fe::DataType_t::FLOAT);
  auto a = fe::graph::SDPA_backward_attributes().set_name("attention_backward").set_attn_scale(r.softmax_scale);
  a.set_deterministic_algorithm(deterministic);
  set_mask(a, r);
  if (r.sink != nullptr) {
    a.set_sink_token(per_head(*g, "sink", kSink, r.heads_q));
    a.set_dsink_token(per_head(*g, "dsink", kDsink, r.heads_q));
  }
  auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, Stats, a);
  set_output(dQ, kDq, b, {r.heads_q, r.seqlen_q, r.head_dim, r.dq_sb, r.dq_ss, r.dq_sh});
  set_output(dK, kDk, b, {r.heads_kv, r.seqlen_k, r.head_dim, r.dk_sb, r.dk_ss, r.dk_sh});
  set_output(dV, kDv, b, {r.heads_kv, r.seqlen_k, r.head_dim_v, r.dv_sb, r.dv_ss, r.dv_sh});
  return g;
}

// What a graph depends on: shapes, strides, mask, scale, sink, direction; never data pointers.
std::vector<int64_t> key_of(const Problem& p, bool backward, bool deterministic, int device) {
  const PtAttnParams& r = p.params;
  int32_t scale_bits = 0;
  std::memcpy(&scale_bits, &r.softmax_scale, sizeof(scale_bits));
  std::vector<int64_t> key{device,     backward,   deterministic, p.dtype,      r.batch,      r.seqlen_q,
                           r.seqlen_k, r.heads_q,  r.heads_kv,    r.head_dim,   r.head_dim_v, r.q_sb,
                           r.q_ss,     r.q_sh,     r.k_sb,        r.k_ss,       r.k_sh,       r.v_sb,
                           r.v_ss,     r.v_sh,     r.o_sb,        r.o_ss,       r.o_sh,       r.lse_sb,
                           r.lse_sh,   scale_bits, r.window_left, r.window_right, r.sink != nullptr};
  if (backward) {
    for (int64_t s : {r.do_sb, r.do_ss, r.do_sh, r.dq_sb, r.dq_ss, r.dq_sh, r.dk_sb, r.dk_ss, r.dk_sh, r.dv_sb,
                      r.dv_ss, r.dv_sh})
      key.push_back(s);
  }
  return key;
}

// Problems cuDNN's SDPA does not take, known before building a graph.
std::string static_refusal(const Problem& p) {
  const PtAttnParams& r = p.params;
  if (r.cu_seqlens_q != nullptr) return "packed sequences (cu_seqlens) are not wired to cuDNN yet";
  if (r.seqlen_q == 0 || r.seqlen_k == 0) return "an empty sequence";
  const Window w = effective_window(r);
  if (w.left >= 0 && w.right < 0) return "a left window without a right bound";
  // cuDNN's value for a row that sees no key differs from ours (output 0, lse +inf).
  if (r.window_right >= 0 && r.seqlen_q - r.seqlen_k > r.window_right) return "query rows that see no key";
  return load_error();
}

}  // namespace

struct Plan {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace = 0;
  std::string refusal;  // non-empty: cuDNN cannot run this problem
  int device = 0;
};

const Plan* plan_for(const Problem& p, bool backward, bool deterministic, std::string* why) {
  std::string refusal = static_refusal(p);
  if (!refusal.empty()) {
    *why = refusal;
    return nullptr;
  }
  const int device = current_device();
  std::lock_guard<std::mutex> lock(g_mutex);
  static std::map<std::vector<int64_t>, std::unique_ptr<Plan>> plans;
  auto& slot = plans[key_of(p, backward, deterministic, device)];
  if (!slot) {
    auto plan = std::make_unique<Plan>();
    plan->device = device;
    try {
      auto g = build_graph(p, backward, deterministic);
      auto status = g->build(handle_for(device), {fe::HeurMode_t::A});
      if (status.is_good()) status = g->get_workspace_size(plan->workspace);
      if (status.is_good()) {
        plan->graph = std::move(g);
      } else {
        plan->refusal = str_cat("cuDNN refused the graph: ", status.get_message());
      }
    } catch (const std::exception& e) {
      plan->refusal = str_cat("cuDNN graph construction failed: ", e.what());
    }
    slot = std::move(plan);
  }
  if (!slot->refusal.empty()) {
    *why = slot->refusal;
    return nullptr;
  }
  return slot.get();
}

size_t workspace_bytes(const Plan& plan) { return static_cast<size_t>(plan.workspace); }

void execute(const Plan& plan, const Problem& p, void* workspace, void* stream) {
  const PtAttnParams& r = p.params;
  std::unordered_map<int64_t, void*> pack{{kQ, const_cast<void*>(r.q)},
                                          {kK, const_cast<void*>(r.k)},
                                          {kV, const_cast<void*>(r.v)},
                                          {kO, r.out},
                                          {kStats, r.lse}};
  if (r.sink != nullptr) pack[kSink] = const_cast<float*>(r.sink);
  if (r.dout != nullptr) {
    pack[kDout] = const_cast<void*>(r.dout);
    pack[kDq] = r.dq, pack[kDk] = r.dk, pack[kDv] = r.dv;
    if (r.sink != nullptr) pack[kDsink] = r.dsink;
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  cudnnHandle_t h = handle_for(plan.device);
  const cudnnStatus_t s = fe::detail::set_stream(h, static_cast<cudaStream_t>(stream));
  if (s != CUDNN_STATUS_SUCCESS) PT_THROW(PT_ERROR_CUDA, "cudnnSetStream failed with status ", int(s));
  auto status = plan.graph->execute(h, pack, workspace);
  if (status.is_bad())
    PT_THROW(PT_ERROR_CUDA, "cuDNN attention ", r.dout ? "backward" : "forward", " failed: ", status.get_message());
}

#endif  // PT_HAVE_CUDNN_FRONTEND

}  // namespace primus_turbo::attention::cudnn
