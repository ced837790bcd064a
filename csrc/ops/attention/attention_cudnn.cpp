#include "ops/attention/attention_cudnn.h"

#include <cmath>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "primus_turbo/kernels/attention/ragged_abi.h"
#include "primus_turbo/layout.h"
#include "runtime/device.h"
#include "runtime/jit_runtime.h"

#if PT_HAVE_CUDNN_FRONTEND
#include <dlfcn.h>

#include <cudnn_frontend.h>

// The frontend's dynamic-loading shim resolves every cuDNN entry point through this handle.
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}
#endif

namespace primus_turbo::attention::cudnn {

namespace {

// The packed-sequence metadata module (kernels/attention/ragged_offsets.cuh): small, no CUTLASS.
PtRaggedFn load_ragged_kernel(const std::string& arch) {
  static jit::LoadedCache<std::string, PtRaggedFn> loaded;
  return loaded.get(arch, [&] {
    jit::ModuleRequest r;
    r.name = "attention_ragged_offsets";
    r.arch = arch;
    r.needs_cutlass = false;
    r.source = "#include \"primus_turbo/kernels/attention/ragged_offsets.cuh\"\n"
               "using Kernel = primus_turbo::kernels::attention::RaggedOffsets;\nPT_JIT_EXPORT_RAGGED(Kernel)\n";
    auto module = jit::get_module(r);  // may compile: outside the cache's lock
    return module->function<PtRaggedFn>("pt_ragged_run");
  });
}

}  // namespace

void prepare_ragged_metadata(const std::string& arch) { load_ragged_kernel(arch); }

#if !PT_HAVE_CUDNN_FRONTEND

struct Plan {};

const Plan* plan_for(const Problem&, bool, bool, std::string* why) {
  *why = "this build has no cuDNN frontend headers (install nvidia-cudnn-frontend and rebuild)";
  return nullptr;
}
size_t workspace_bytes(const Plan&, const Problem&) { return 0; }
void execute(const Plan&, const Problem&, void*, void*) {
  PT_THROW(PT_ERROR_NOT_SUPPORTED, "the CUDNN attention backend is not built");
}

#else

namespace fe = cudnn_frontend;

namespace {

enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kSink, kDout, kDq, kDk, kDv, kDsink,
  // packed sequences: lengths and, per operand, where each sequence starts (ragged offsets)
  kSeqLens, kSeqLensK, kRagQ, kRagK, kRagV, kRagO, kRagStats, kRagDout, kRagDq, kRagDk, kRagDv
};

// Ragged offset tensors, in the order the metadata kernel writes them (PtRaggedParams.offsets).
constexpr Uid kRaggedUids[] = {kRagQ, kRagK, kRagV, kRagO, kRagStats, kRagDout, kRagDq, kRagDk, kRagDv};
constexpr int kForwardRagged = 5;  // q, k, v, o, stats; the backward adds dout, dq, dk, dv

// Ragged offset tensors a direction's graph reads (the first ones of kRaggedUids).
int ragged_count(bool backward) { return backward ? static_cast<int>(std::size(kRaggedUids)) : kForwardRagged; }

bool packed(const Problem& p) { return p.params.cu_seqlens_q != nullptr; }

// A packed problem's graph is built for its sequence-length bound rounded up to a power of two (at
// least 64), so batches of documents of changing lengths share a few graphs.
int64_t seq_bucket(int64_t s) {
  int64_t b = 64;
  while (b < s) b *= 2;
  return b;
}

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

// Packed sequences: each operand is a ragged [B, H, S, D] whose sequence b starts at the element
// offset the metadata kernel wrote (no batch stride; cuDNN wants one that no other stride exceeds).
void make_ragged(fe::graph::Graph& g, const std::shared_ptr<fe::graph::Tensor_attributes>& t, Uid ragged_uid,
                 int64_t batch) {
  auto offsets = g.tensor(fe::graph::Tensor_attributes()
                              .set_name("ragged_offset")
                              .set_uid(ragged_uid)
                              .set_dim({batch + 1, 1, 1, 1})
                              .set_stride({1, 1, 1, 1})
                              .set_data_type(fe::DataType_t::INT64));
  t->set_ragged_offset(offsets);
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
// right side of at least Sq - 1 hides no key of any row (packed: of any sequence up to the max
// lengths). A right side is kept while the left one constrains (cuDNN takes a left bound only with
// a right one; an unconstraining right bound changes nothing).
struct Window {
  int64_t left, right;
};
Window effective_window(const PtAttnParams& r) {
  const int64_t left = r.window_left >= r.seqlen_k - 1 ? -1 : r.window_left;
  return {left, r.window_right >= r.seqlen_q - 1 && left < 0 ? -1 : r.window_right};
}

// Our window rule (key j visible from query i iff i + Sk - Sq - left <= j <= i + Sk - Sq + right) in
// cuDNN's terms: a band around the bottom-right diagonal whose left bound is exclusive.
template <class Attributes>
void set_mask(Attributes& a, const PtAttnParams& r) {
  const Window w = effective_window(r);
  if (w.right < 0) return;  // plan_for refused a left window without a right one
  // Packed sequences run on cuDNN only with one cu_seqlens for q and k (equal lengths): top-left.
  const bool same_lengths = r.cu_seqlens_q != nullptr || r.seqlen_q == r.seqlen_k;
  a.set_diagonal_alignment(same_lengths ? fe::DiagonalAlignment_t::TOP_LEFT : fe::DiagonalAlignment_t::BOTTOM_RIGHT);
  a.set_diagonal_band_right_bound(static_cast<int>(w.right));
  if (w.left >= 0) a.set_diagonal_band_left_bound(static_cast<int>(w.left + 1));
}

std::shared_ptr<fe::graph::Tensor_attributes> seq_lens(fe::graph::Graph& g, Uid uid, int64_t batch) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name("seq_lens")
                      .set_uid(uid)
                      .set_dim({batch, 1, 1, 1})
                      .set_stride({1, 1, 1, 1})
                      .set_data_type(fe::DataType_t::INT32));
}

std::shared_ptr<fe::graph::Graph> build_graph(const Problem& p, bool backward, bool deterministic) {
  const PtAttnParams& r = p.params;
  const bool ragged = packed(p);
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(p.dtype == PT_BFLOAT16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const int64_t b = r.batch;
  // Packed: the length bound bucketed; the batch stride is unused (the ragged offsets place each
  // sequence) but must exceed the others and keep the alignment: a bucket of tokens.
  const int64_t sq = ragged ? seq_bucket(r.seqlen_q) : r.seqlen_q, sk = ragged ? seq_bucket(r.seqlen_k) : r.seqlen_k;
  const auto sbq = [&](int64_t sb, int64_t ss) { return ragged ? sq * ss : sb; };
  const auto sbk = [&](int64_t sb, int64_t ss) { return ragged ? sk * ss : sb; };
  const Dims q{r.heads_q, sq, r.head_dim, sbq(r.q_sb, r.q_ss), r.q_ss, r.q_sh};
  const Dims k{r.heads_kv, sk, r.head_dim, sbk(r.k_sb, r.k_ss), r.k_ss, r.k_sh};
  const Dims v{r.heads_kv, sk, r.head_dim_v, sbk(r.v_sb, r.v_ss), r.v_ss, r.v_sh};
  const Dims o{r.heads_q, sq, r.head_dim_v, sbq(r.o_sb, r.o_ss), r.o_ss, r.o_sh};
  // Packed: cuDNN's statistics token-major in a workspace [Tq, Hq] (ours is [Hq, Tq]).
  const Dims stats = ragged ? Dims{r.heads_q, sq, 1, sq * r.heads_q, r.heads_q, 1}
                            : Dims{r.heads_q, r.seqlen_q, 1, r.lse_sb, 1, r.lse_sh};
  auto Q = operand(*g, "q", kQ, b, q), K = operand(*g, "k", kK, b, k), V = operand(*g, "v", kV, b, v);
  if (ragged) {
    make_ragged(*g, Q, kRagQ, b);
    make_ragged(*g, K, kRagK, b);
    make_ragged(*g, V, kRagV, b);
  }
  const auto padding = [&](auto& a) {
    if (ragged) a.set_padding_mask(true).set_seq_len_q(seq_lens(*g, kSeqLens, b)).set_seq_len_kv(seq_lens(*g, kSeqLensK, b));
  };
  if (!backward) {
    auto a = fe::graph::SDPA_attributes().set_name("attention").set_generate_stats(true).set_attn_scale(
        r.softmax_scale);
    set_mask(a, r);
    padding(a);
    if (r.sink != nullptr) a.set_sink_token(per_head(*g, "sink", kSink, r.heads_q));
    auto [O, Stats] = g->sdpa(Q, K, V, a);
    set_output(O, kO, b, o);
    set_output(Stats, kStats, b, stats);
    Stats->set_data_type(fe::DataType_t::FLOAT);
    if (ragged) {
      make_ragged(*g, O, kRagO, b);
      make_ragged(*g, Stats, kRagStats, b);
    }
    return g;
  }
  const Dims dout{r.heads_q, sq, r.head_dim_v, sbq(r.do_sb, r.do_ss), r.do_ss, r.do_sh};
  auto O = operand(*g, "out", kO, b, o), dO = operand(*g, "dout", kDout, b, dout);
  auto Stats = operand(*g, "lse", kStats, b, stats);
  Stats->set_data_type(fe::DataType_t::FLOAT);
  if (ragged) {
    make_ragged(*g, O, kRagO, b);
    make_ragged(*g, dO, kRagDout, b);
    make_ragged(*g, Stats, kRagStats, b);
  }
  auto a = fe::graph::SDPA_backward_attributes().set_name("attention_backward").set_attn_scale(r.softmax_scale);
  a.set_deterministic_algorithm(deterministic);
  set_mask(a, r);
  padding(a);
  if (r.sink != nullptr) {
    a.set_sink_token(per_head(*g, "sink", kSink, r.heads_q));
    a.set_dsink_token(per_head(*g, "dsink", kDsink, r.heads_q));
  }
  auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, Stats, a);
  set_output(dQ, kDq, b, {r.heads_q, sq, r.head_dim, sbq(r.dq_sb, r.dq_ss), r.dq_ss, r.dq_sh});
  set_output(dK, kDk, b, {r.heads_kv, sk, r.head_dim, sbk(r.dk_sb, r.dk_ss), r.dk_ss, r.dk_sh});
  set_output(dV, kDv, b, {r.heads_kv, sk, r.head_dim_v, sbk(r.dv_sb, r.dv_ss), r.dv_ss, r.dv_sh});
  if (ragged) {
    make_ragged(*g, dQ, kRagDq, b);
    make_ragged(*g, dK, kRagDk, b);
    make_ragged(*g, dV, kRagDv, b);
  }
  return g;
}

// What a graph depends on: shapes, strides, mask, scale, sink, direction; never data pointers.
std::vector<int64_t> key_of(const Problem& p, bool backward, bool deterministic, int device) {
  const PtAttnParams& r = p.params;
  int32_t scale_bits = 0;
  std::memcpy(&scale_bits, &r.softmax_scale, sizeof(scale_bits));
  const bool ragged = packed(p);
  const int64_t sq = ragged ? seq_bucket(r.seqlen_q) : r.seqlen_q, sk = ragged ? seq_bucket(r.seqlen_k) : r.seqlen_k;
  // Packed: the lse strides hold the token count, which the graph never reads (it writes cuDNN's own
  // statistics layout); keyed, they would make a graph per batch of documents.
  const int64_t lse_sb = ragged ? 0 : r.lse_sb, lse_sh = ragged ? 0 : r.lse_sh;
  // The mask as the graph has it: packed problems share a graph across max lengths of one bucket,
  // whose effective windows differ (a side may constrain at one max length and not at another).
  const Window w = effective_window(r);
  std::vector<int64_t> key{device,     backward,   deterministic, p.dtype,      r.batch,      sq,
                           sk,         r.heads_q,  r.heads_kv,    r.head_dim,   r.head_dim_v, r.q_sb,
                           r.q_ss,     r.q_sh,     r.k_sb,        r.k_ss,       r.k_sh,       r.v_sb,
                           r.v_ss,     r.v_sh,     r.o_sb,        r.o_ss,       r.o_sh,       lse_sb,
                           lse_sh,     scale_bits, w.left,        w.right,      r.sink != nullptr, ragged};
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
  if (r.cu_seqlens_q != nullptr) {
    // One set of lengths for q and k, known equal without reading them: no row of a packed
    // sequence then lacks a visible key (cuDNN's value for such a row differs from ours).
    if (r.cu_seqlens_q != r.cu_seqlens_k)
      return "packed sequences with separate cu_seqlens_q and cu_seqlens_k (pass one tensor for both)";
    if (r.sink != nullptr) return "packed sequences with a sink";
    if (r.batch == 0) return "no sequences";
  }
  if (r.seqlen_q == 0 || r.seqlen_k == 0) return "an empty sequence";
  const Window w = effective_window(r);
  if (w.left >= 0 && w.right < 0) return "a left window without a right bound";
  // cuDNN's value for a row that sees no key differs from ours (output 0, lse +inf).
  if (r.cu_seqlens_q == nullptr && r.window_right >= 0 && r.seqlen_q - r.seqlen_k > r.window_right)
    return "query rows that see no key";
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

namespace {

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

// The packed-sequence scratch after cuDNN's own workspace: lengths, ragged offsets, and cuDNN's
// token-major statistics.
struct RaggedScratch {
  int32_t* seqlens;
  int64_t* offsets;
  float* stats;
  size_t bytes;
};

RaggedScratch ragged_scratch(const Problem& p, char* base) {
  const PtAttnParams& r = p.params;
  const size_t lens = align256(sizeof(int32_t) * r.batch);
  const size_t offs = align256(sizeof(int64_t) * (r.batch + 1) * std::size(kRaggedUids));
  const size_t stats = align256(sizeof(float) * r.total_q * r.heads_q);
  return {reinterpret_cast<int32_t*>(base), reinterpret_cast<int64_t*>(base + lens),
          reinterpret_cast<float*>(base + lens + offs), lens + offs + stats};
}

pt_tensor matrix(void* data, int64_t rows, int64_t cols) {
  pt_tensor t{};
  t.data = data;
  t.dtype = PT_FLOAT32;
  t.ndim = 2;
  t.shape[0] = rows, t.shape[1] = cols;
  t.strides[0] = cols, t.strides[1] = 1;
  return t;
}

// y = x^T for fp32 matrices (the statistics between cuDNN's token-major layout and ours).
void transpose(void* x, int64_t rows, int64_t cols, void* y, void* stream) {
  const pt_tensor in = matrix(x, rows, cols);
  pt_tensor out = matrix(y, cols, rows);
  if (pt_transpose_last2(&in, &out, stream) != PT_SUCCESS)
    PT_THROW(PT_ERROR_CUDA, "cuDNN attention: statistics transpose failed: ", pt_last_error());
}

// Before the graph of a packed problem: lengths and offsets from cu_seqlens, the output rows no
// sequence covers set (zero; +inf for the statistics), and for the backward our [Hq, Tq]
// log-sum-exp turned token-major for cuDNN.
void prepare_ragged(const Problem& p, bool backward, const RaggedScratch& scratch, void* stream) {
  const PtAttnParams& r = p.params;
  PtRaggedParams rp{};
  rp.cu_seqlens = r.cu_seqlens_q;
  rp.seqlens = scratch.seqlens;
  rp.offsets = scratch.offsets;
  rp.batch = r.batch;
  rp.total = r.total_q < r.total_k ? r.total_q : r.total_k;
  rp.max_len = r.seqlen_q < r.seqlen_k ? r.seqlen_q : r.seqlen_k;
  // Token strides in kRaggedUids' order (the statistics: token-major, Hq per token).
  const int64_t strides[] = {r.q_ss, r.k_ss, r.v_ss, r.o_ss, r.heads_q, r.do_ss, r.dq_ss, r.dk_ss, r.dv_ss};
  static_assert(std::size(strides) == std::size(kRaggedUids));
  rp.num_strides = ragged_count(backward);
  for (int i = 0; i < rp.num_strides; ++i) rp.strides[i] = strides[i];
  const auto tail = [&](void* data, int64_t total, int64_t ss, int64_t sh, int32_t heads, int32_t dim, int32_t bytes,
                        float fill) { rp.tails[rp.num_tails++] = PtRaggedTail{data, total, ss, sh, heads, dim, bytes, fill}; };
  if (backward) {
    tail(r.dq, r.total_q, r.dq_ss, r.dq_sh, r.heads_q, r.head_dim, 2, 0.0f);
    tail(r.dk, r.total_k, r.dk_ss, r.dk_sh, r.heads_kv, r.head_dim, 2, 0.0f);
    tail(r.dv, r.total_k, r.dv_ss, r.dv_sh, r.heads_kv, r.head_dim_v, 2, 0.0f);
  } else {
    tail(r.out, r.total_q, r.o_ss, r.o_sh, r.heads_q, r.head_dim_v, 2, 0.0f);
    tail(scratch.stats, r.total_q, r.heads_q, 1, r.heads_q, 1, 4, INFINITY);
  }
  rp.stream = stream;
  char err[1024] = {0};
  if (load_ragged_kernel(arch_for_device(current_device()))(&rp, err, sizeof(err)) != 0)
    PT_THROW(PT_ERROR_CUDA, "cuDNN attention: packed-sequence metadata failed: ", err);
  if (backward) transpose(r.lse, r.heads_q, r.total_q, scratch.stats, stream);
}

}  // namespace

size_t workspace_bytes(const Plan& plan, const Problem& p) {
  const size_t graph = align256(static_cast<size_t>(plan.workspace));
  return packed(p) ? graph + ragged_scratch(p, nullptr).bytes : graph;
}

void execute(const Plan& plan, const Problem& p, void* workspace, void* stream) {
  const PtAttnParams& r = p.params;
  const bool ragged = packed(p), backward = r.dout != nullptr;
  const RaggedScratch scratch =
      ragged_scratch(p, static_cast<char*>(workspace) + align256(static_cast<size_t>(plan.workspace)));
  if (ragged) prepare_ragged(p, backward, scratch, stream);
  std::unordered_map<int64_t, void*> pack{{kQ, const_cast<void*>(r.q)},
                                          {kK, const_cast<void*>(r.k)},
                                          {kV, const_cast<void*>(r.v)},
                                          {kO, r.out},
                                          {kStats, ragged ? scratch.stats : r.lse}};
  if (ragged) {
    pack[kSeqLens] = pack[kSeqLensK] = scratch.seqlens;
    for (int i = 0; i < ragged_count(backward); ++i) pack[kRaggedUids[i]] = scratch.offsets + i * (r.batch + 1);
  }
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
  if (ragged && !backward) transpose(scratch.stats, r.total_q, r.heads_q, r.lse, stream);  // into our [Hq, Tq]
}

#endif  // PT_HAVE_CUDNN_FRONTEND

}  // namespace primus_turbo::attention::cudnn
