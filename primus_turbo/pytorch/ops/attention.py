"""turbo.ops.flash_attn_func and turbo.ops.flash_attn_varlen_func: fused softmax attention,
forward and backward, with the original library's (and FlashAttention's) Python interface, on one
of two backends: TURBO (the library's own kernels, kernels/attention: every feature, packed
sequences included) and CUDNN (cuDNN's fused attention through cached cuDNN-frontend graphs, for
fixed-length batches). Unset, the core picks CUDNN where it runs the problem (it is the faster one
today) and TURBO elsewhere; ``set_attn_backend`` / ``PRIMUS_TURBO_ATTN_BACKEND`` force one.
With autotune (``set_attn_backend(auto_tune=True)``, ``PRIMUS_TURBO_ATTN_BACKEND=autotune``, or
``set_auto_tune(True)`` / ``PRIMUS_TURBO_AUTO_TUNE=1`` with no backend set) an eager fixed-length
call times both backends on its own tensors the first time its problem (shapes, strides, dtype,
window, sink, forward or training) is seen, forward and backward together for a training call, and
keeps the faster, in memory and in the on-disk autotune cache; packed batches (a new problem every
step), compiled graphs, fake tensors and captures of an unmeasured problem get the core's choice.

One native op per direction (csrc/bindings/torch/attention_ops.cpp) takes both the fixed-length
[B, S, H, D] and the packed varlen [T, H, D] form (cu_seqlens given), GQA/MQA, a (left, right)
window of which causal is the right = 0 case, and GPT-OSS attention sinks. It reads q, k and v in
place through their strides, so [S, B, H, D] and [B, H, S, D] tensors passed as transposed views
cost no copy. TURBO's backward at head dims 128/128 on Hopper adds dQ up in float32 across key
blocks in no fixed order (its last bits vary from run to run); ``deterministic=True`` takes its
separate dQ kernel instead, which is bitwise reproducible, as TURBO is at every other head dim;
with a forced CUDNN it selects cuDNN's deterministic algorithm.
"""

import math
import numbers
import operator

import torch
from torch._guards import detect_fake_mode
from torch.utils._python_dispatch import _get_current_dispatch_mode as _current_dispatch_mode

from primus_turbo.pytorch.core import autotune, library, native
from primus_turbo.pytorch.core.backend import BackendType, OpFamily, PrecisionType, resolve, settings_token
from primus_turbo.pytorch.ops._checks import check_cuda_tensors, flag

__all__ = ["flash_attn_func", "flash_attn_varlen_func"]

_DTYPES = (torch.float16, torch.bfloat16)
#: (head dim of q and k, head dim of v) pairs the kernels are built for.
HEAD_DIMS = ((64, 64), (96, 96), (128, 128), (192, 128), (192, 192), (256, 256))
_NO_WINDOW = (-1, -1)


_F32_MAX = 3.4028234663852886e38  # the kernels take the scale in float32
_INT32_MAX = 2**31 - 1  # window sides travel as int32
_MAX_SEQLEN = 2**30  # the core's limit on a sequence


def _is_int(x) -> bool:
    return isinstance(x, (int, torch.SymInt)) and not isinstance(x, bool)


def _check_args(
    q, k, v, sink, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, wl, wr, op="flash_attn forward"
):
    """Validates the native op's arguments (no device work) with the native op's messages and
    exception classes. The fake implementation runs it, so meta/fake tensors and torch.compile's
    tracing raise what the native op raises on the GPU."""
    packed = cu_seqlens_q is not None or cu_seqlens_k is not None
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: argument '{name}' must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in _DTYPES:
            raise TypeError(f"{op}: argument '{name}' has dtype {t.dtype}; expected torch.bfloat16 or torch.float16")
        if t.dtype != q.dtype:
            raise TypeError(f"{op}: argument '{name}' has dtype {t.dtype}; expected the dtype of 'q' ({q.dtype})")
        if t.dim() != (3 if packed else 4):
            want = (
                "[total_tokens, heads, head_dim] (cu_seqlens given)" if packed else "[batch, seqlen, heads, head_dim]"
            )
            raise ValueError(f"{op}: argument '{name}' has shape {list(t.shape)}; expected {want}")
    if (cu_seqlens_q is None) != (cu_seqlens_k is None):
        raise ValueError(f"{op}: arguments 'cu_seqlens_q' and 'cu_seqlens_k' must be given together")
    if not packed and not q.shape[0] == k.shape[0] == v.shape[0]:
        raise ValueError(
            f"{op}: arguments 'q', 'k', 'v' have shapes {list(q.shape)}, {list(k.shape)}, {list(v.shape)}; "
            "expected the same batch size"
        )
    if v.shape[:-1] != k.shape[:-1]:
        raise ValueError(
            f"{op}: argument 'v' has shape {list(v.shape)}; expected the sequence length and heads of 'k' {list(k.shape)}"
        )
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"{op}: argument 'k' has head_dim {k.shape[-1]}; expected the head_dim of 'q' ({q.shape[-1]})")
    hq, hkv = q.shape[-2], k.shape[-2]
    if hkv < 1 or hq % hkv:
        raise ValueError(
            f"{op}: argument 'k' has {hkv} heads; the number of heads of 'q' ({hq}) must be a multiple of it (GQA/MQA)"
        )
    if (q.shape[-1], v.shape[-1]) not in HEAD_DIMS:
        raise NotImplementedError(
            f"{op}: head dims (q/k {q.shape[-1]}, v {v.shape[-1]}) are not supported; expected 64, 96, 128, 192 "
            "or 256 for both, or 192 for q/k with 128 for v"
        )
    if not isinstance(softmax_scale, torch.SymFloat) and (
        not isinstance(softmax_scale, float) or not math.isfinite(softmax_scale) or abs(softmax_scale) > _F32_MAX
    ):  # a SymFloat (D ** -0.5 of a dynamic head dim) is checked by the native op
        raise ValueError(f"{op}: argument 'softmax_scale' must be finite in float32, got {softmax_scale!r}")
    if not (_is_int(wl) and _is_int(wr) and -1 <= wl <= _INT32_MAX and -1 <= wr <= _INT32_MAX):
        raise ValueError(
            f"{op}: argument 'window_size' is ({wl}, {wr}); each side must be in [0, 2^31), or -1 for unbounded"
        )
    if packed:
        num_seqs = (
            cu_seqlens_q.shape[0] - 1 if isinstance(cu_seqlens_q, torch.Tensor) and cu_seqlens_q.dim() == 1 else 0
        )
        for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
            if not isinstance(t, torch.Tensor) or t.dtype not in (torch.int32, torch.int64):
                raise TypeError(
                    f"{op}: argument '{name}' must be an int32 torch.Tensor, got {getattr(t, 'dtype', type(t))}"
                )
            if t.dim() != 1 or num_seqs < 1 or t.shape[0] != num_seqs + 1:
                want = f"[{num_seqs + 1}] (num_seqs + 1)" if num_seqs >= 1 else "[num_seqs + 1] with num_seqs >= 1"
                raise ValueError(f"{op}: argument '{name}' has shape {list(t.shape)}; expected {want}")
        if not (
            _is_int(max_seqlen_q) and _is_int(max_seqlen_k)
            and 0 <= max_seqlen_q <= _MAX_SEQLEN and 0 <= max_seqlen_k <= _MAX_SEQLEN
        ):
            raise ValueError(
                f"{op}: arguments 'max_seqlen_q' and 'max_seqlen_k' must be in [0, 2^30], got {max_seqlen_q!r} and "
                f"{max_seqlen_k!r}"
            )
    if sink is not None:
        if not isinstance(sink, torch.Tensor) or not sink.is_floating_point():
            raise TypeError(
                f"{op}: argument 'sink' must be a float32 torch.Tensor, got {getattr(sink, 'dtype', type(sink))}"
            )
        if sink.dim() != 1 or sink.shape[0] != hq:
            raise ValueError(
                f"{op}: argument 'sink' has shape {list(sink.shape)}; expected [{hq}] (one logit per query head)"
            )
    optional = {
        n: t
        for n, t in (("sink", sink), ("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k))
        if t is not None
    }
    check_cuda_tensors(op, q=q, k=k, v=v, **optional)


# ---- native ops (csrc/bindings/torch/attention_ops.cpp) ----------------------------------------


def _fwd_fake(q, k, v, sink, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, wl, wr, backend):
    _check_args(q, k, v, sink, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, wl, wr)
    return forward_outputs(q, v, cu_seqlens_q is not None)


def forward_outputs(q, v, packed: bool):
    """Empty (out, lse) of a forward: out [.., Hq, Dv] in q's dtype; lse float32 [B, Hq, Sq], or
    [Hq, Tq] packed."""
    out = q.new_empty((*q.shape[:-1], v.shape[-1]))
    if packed:
        return out, q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
    return out, q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)


def _bwd_fake(
    dout, q, k, v, out, lse, sink, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, wl, wr, backend, det
):
    # The forward's checks, then the saved tensors against what the forward made of them.
    want_out, want_lse = _fwd_fake(
        q, k, v, sink, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, wl, wr, backend
    )
    for name, t, want in (("dout", dout, want_out), ("out", out, want_out), ("lse", lse, want_lse)):
        if not isinstance(t, torch.Tensor) or t.shape != want.shape:
            raise ValueError(
                f"flash_attn backward: argument '{name}' has shape {tuple(getattr(t, 'shape', ()))}; expected "
                f"{tuple(want.shape)}"
            )
    if dout.dtype != q.dtype or out.dtype != q.dtype or lse.dtype != torch.float32:
        raise TypeError("flash_attn backward: 'dout' and 'out' must have q's dtype and 'lse' float32")
    dsink = q.new_empty((sink.shape[0] if sink is not None else 0,), dtype=torch.float32)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dsink


library.register_fake("attention_fwd", _fwd_fake)
library.register_fake("attention_bwd", _bwd_fake)
_fwd_op = native.ops.attention_fwd.default
_bwd_op = native.ops.attention_bwd.default
# With the C++ autograd (bindings/torch_autograd/attention_autograd.cpp): a training call's forward
# and backward without Python in between (eager mode; torch.compile traces FlashAttnFunction).
_train_op = native.training_op("attention_train", lambda *args: _fwd_fake(*args[:-1]))


class FlashAttnFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sink, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, wl, wr, backend, det):
        args = (max_seqlen_q, max_seqlen_k, scale, wl, wr, backend)
        out, lse = _fwd_op(q, k, v, sink, cu_seqlens_q, cu_seqlens_k, *args)
        ctx.save_for_backward(q, k, v, out, lse, sink, cu_seqlens_q, cu_seqlens_k)
        ctx.args = (*args, det)
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)  # no zero-filled gradient for lse on every backward
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        if dout is None:
            return (None,) * 13
        return *attention_grads(ctx, dout), *(None,) * 9


def attention_grads(ctx, dout):
    """(dq, dk, dv, dsink or None) from a forward's saved (q, k, v, out, lse, sink, cu_q, cu_k) and
    ctx.args (max_q, max_k, scale, left, right, backend, deterministic): one backward op call."""
    q, k, v, out, lse, sink, cu_q, cu_k = ctx.saved_tensors
    # dout may be any view (the expanded gradient of out.sum() has all strides 0): the native op
    # reads aligned views in place and copies the rest.
    dq, dk, dv, dsink = _bwd_op(dout, q, k, v, out, lse, sink, cu_q, cu_k, *ctx.args)
    return dq, dk, dv, (dsink if sink is not None else None)


def _unsupported(op, dropout_p, bias, alibi_slopes, return_attn_probs) -> None:
    """The original's arguments these kernels do not implement: refuse rather than ignore."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real):
        raise TypeError(f"{op}: argument 'dropout_p' must be a float (0.0), got {type(dropout_p).__name__}")
    if dropout_p:
        raise NotImplementedError(
            f"{op}: attention dropout is not supported (argument 'dropout_p' must be 0.0, got {dropout_p!r})"
        )
    if bias is not None:
        raise NotImplementedError(f"{op}: argument 'bias' (an additive attention bias) is not supported; pass None")
    if alibi_slopes is not None:
        raise NotImplementedError(f"{op}: argument 'alibi_slopes' (ALiBi) is not supported; pass None")
    if return_attn_probs:
        raise NotImplementedError(
            f"{op}: argument 'return_attn_probs=True' is not supported (the kernels never form the probabilities); "
            "use return_lse=True for the log-sum-exp"
        )


def _window(op, window_size, causal: bool):
    """(left, right) ints; causal means right = 0 (bottom-right aligned, as in FlashAttention)."""
    if window_size is _NO_WINDOW or window_size == _NO_WINDOW:
        left, right = -1, -1
    else:
        try:
            left, right = window_size
            if isinstance(left, bool) or isinstance(right, bool):
                raise TypeError
            if type(left) is not int or type(right) is not int:
                left, right = operator.index(left), operator.index(right)  # numpy ints; never floats
        except (TypeError, ValueError):
            raise TypeError(
                f"{op}: argument 'window_size' must be a pair of ints (left, right), got {window_size!r}"
            ) from None
        if not (-1 <= left <= _INT32_MAX and -1 <= right <= _INT32_MAX):
            raise ValueError(
                f"{op}: argument 'window_size' is ({left}, {right}); each side must be in [0, 2^31), or -1 for unbounded"
            )
    return left, (0 if causal else right)


def _scale(op, softmax_scale, q) -> float:
    if softmax_scale is None:
        # A head dim of 0 is refused by the head-dim check, naming q; 1.0 only gets it there.
        return q.shape[-1] ** -0.5 if isinstance(q, torch.Tensor) and q.dim() and q.shape[-1] else 1.0
    if type(softmax_scale) is not float:
        if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
            raise TypeError(
                f"{op}: argument 'softmax_scale' must be a float or None, got {type(softmax_scale).__name__}"
            )
        try:
            softmax_scale = float(softmax_scale)
        except OverflowError:
            softmax_scale = math.inf
    if not math.isfinite(softmax_scale) or abs(softmax_scale) > _F32_MAX:  # the kernels read it as float32
        raise ValueError(f"{op}: argument 'softmax_scale' must be finite in float32, got {softmax_scale!r}")
    return softmax_scale


def _float32_sink(sink):
    # The kernels take float32 logits; a model's bf16 sink parameter is cast here, differentiably.
    if isinstance(sink, torch.Tensor) and sink.dtype != torch.float32 and sink.is_floating_point():
        return sink.float()
    return sink


def _common_args(op, q, dropout_p, softmax_scale, causal, window_size, bias, alibi_slopes, return_attn_probs, sink):
    """What both entry points do with their shared keywords: refuse the unsupported ones, then
    (softmax scale, window left, window right, float32 sink)."""
    if type(dropout_p) is not float or dropout_p or bias is not None or alibi_slopes is not None or return_attn_probs:
        _unsupported(op, dropout_p, bias, alibi_slopes, return_attn_probs)
    scale = _scale(op, softmax_scale, q)
    wl, wr = _window(op, window_size, flag(op, "causal", causal))
    return scale, wl, wr, _float32_sink(sink)


def _tensors(q, k, v, sink, *more) -> bool:
    """Whether the arguments are tensors (else the full checks name the one that is not)."""
    ok = isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)
    return ok and (sink is None or isinstance(sink, torch.Tensor)) and all(isinstance(t, torch.Tensor) for t in more)


_backend_cache = [None, 0]  # (settings token, backend code) of the last lookup
_BACKEND_CODES = {BackendType.TURBO: 4, BackendType.CUDNN: 3}  # pt_backend
BACKEND_CUDNN = _BACKEND_CODES[BackendType.CUDNN]
AUTOTUNE = -1  # _backend_code's answer when the backend is picked per problem by measuring


def _backend_code(op) -> int:
    """The pt_backend code the native op gets: TURBO, CUDNN, 0 (unset) for the core's choice, or
    AUTOTUNE. Another backend is refused, not ignored. Looked up again only when the settings
    change."""
    token = settings_token(OpFamily.ATTN)
    if token == _backend_cache[0]:
        return _backend_cache[1]
    choice = resolve(OpFamily.ATTN, PrecisionType.BF16_FP16_FP32)  # code > environment > autotune
    backend = choice.backend
    if backend is not None and backend not in _BACKEND_CODES:
        raise NotImplementedError(
            f"{op}: attention backend {backend.name} is not available; choose TURBO (our kernel) or CUDNN, or leave "
            "it unset (set_attn_backend(None) or PRIMUS_TURBO_ATTN_BACKEND unset)"
        )
    code = _BACKEND_CODES[backend] if backend is not None else (AUTOTUNE if choice.auto_tune else 0)
    _backend_cache[:] = [token, code]
    return code


@torch.compiler.assume_constant_result
def _traced_backend_code() -> int:
    """The setting as torch.compile sees it: read when tracing, a constant of the graph. Autotune
    needs the call's tensors, which a trace does not have: the core's choice instead."""
    code = _backend_code("flash_attn")
    return 0 if code == AUTOTUNE else code


class AttentionProblem(autotune.TunableProblem):
    """One attention call as autotune sees it: TURBO against CUDNN on the call's own tensors, the
    forward and (for a training call) the backward together, since a training step runs both.
    The CUDNN candidate runs as the backend unset does (code 0: cuDNN for each direction the core
    does not know ours to be faster at, e.g. ours for a backward with sinks), so a measured choice
    is never slower than the unset default."""

    op = OpFamily.ATTN
    precision = PrecisionType.BF16_FP16_FP32
    default_backend = BackendType.CUDNN
    backends = (BackendType.TURBO, BackendType.CUDNN)

    def __init__(self, args: tuple, deterministic: bool, grad: bool):
        """args: the native forward's (q, k, v, sink, cu_q, cu_k, max_q, max_k, scale, wl, wr)."""
        self.args, self.deterministic, self.grad = args, bool(deterministic), grad
        self._dout = None

    def key(self) -> str:
        q, k, v, sink, cu_q, cu_k, max_q, max_k, scale, wl, wr = self.args
        packed = "-" if cu_q is None else f"{cu_q.shape[0] - 1}x{max_q}/{max_k}{'=' if cu_k is cu_q else '!'}"
        views = "".join("c" if t.is_contiguous() else "s" for t in (q, k, v))
        return (
            f"{str(q.dtype)[6:]}|q{list(q.shape)}k{list(k.shape)}v{list(v.shape)}{views}|{packed}|w{wl},{wr}|"
            f"{'sink' if sink is not None else ''}|{'bwd' if self.grad else 'fwd'}{'-det' if self.deterministic else ''}"
        )

    def query(self, backend: BackendType):
        # A problem TURBO cannot run raises in run(), and autotune skips it; the unset default runs
        # every problem.
        return True, 1, ""

    def run(self, backend: BackendType, config: int, for_tuning: bool = False) -> None:
        code = _tuned_backend_code(backend)
        q, k, v, sink, cu_q, cu_k, max_q, max_k, scale, wl, wr = self.args
        with torch.no_grad():  # the native ops alone, outside the caller's autograd graph
            out, lse = _fwd_op(*self.args, code)
            if self.grad:
                if self._dout is None:  # from a private generator: tuning leaves torch's random stream alone
                    gen = torch.Generator(device=out.device).manual_seed(0)
                    self._dout = torch.randn(out.shape, generator=gen, device=out.device, dtype=out.dtype)
                _bwd_op(self._dout, q, k, v, out, lse, sink, cu_q, cu_k, max_q, max_k, scale, wl, wr, code,
                        self.deterministic)


def _tuned_backend_code(backend: BackendType) -> int:
    """The native op's backend code of an autotune candidate: TURBO, or 0 (the unset default) for CUDNN."""
    return _BACKEND_CODES[BackendType.TURBO] if backend is BackendType.TURBO else 0


_tuned = {}  # cheap key of a call -> backend code, in front of autotune's string keys


def _measurable(q, cu_q) -> bool:
    """Whether a call can be measured: plain CUDA tensors outside any tracing or fake-tensor mode,
    and fixed length. Packed batches change their token count and longest sequence every step, so
    each would be a new problem to measure: they keep the core's choice."""
    return (
        cu_q is None and type(q) is torch.Tensor and q.device.type == "cuda"
        and _current_dispatch_mode() is None and detect_fake_mode((q,)) is None
    )


def _tuned_code(args: tuple, deterministic: bool, grad: bool) -> int:
    """AUTOTUNE in eager mode: the measured backend for this call's problem (measured on first
    sight, then remembered, on disk too; each rank measures for itself, as attention calls need
    not line up across ranks); the core's choice where nothing can be measured (_measurable) and
    during a CUDA-graph capture of a problem not measured before."""
    q, k, v, sink, cu_q, cu_k, max_q, max_k, scale, wl, wr = args
    if not _measurable(q, cu_q):
        return 0
    fast = (
        q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype, q.device, sink is None,
        wl, wr, bool(deterministic), grad, settings_token(OpFamily.ATTN),
    )
    code = _tuned.get(fast)
    if code is None:
        choice = autotune.tune(AttentionProblem(args, deterministic, grad), q.device, agree=False)
        code = 0 if choice is None else _tuned_backend_code(choice[0])
        if choice is not None:
            _tuned[fast] = code
    return code


def requested_backend_code() -> int:
    """The attention backend code the settings ask for (AUTOTUNE included); a traced graph keeps
    the choice made when it was traced."""
    return _traced_backend_code() if torch.compiler.is_compiling() else _backend_code("flash_attn")


def backend_code() -> int:
    """requested_backend_code() for callers that do not measure: AUTOTUNE leaves the choice to the
    core."""
    code = requested_backend_code()
    return 0 if code == AUTOTUNE else code


def needs_grad(q, k, v, sink) -> bool:
    """Whether autograd must record the call (else the forward op runs alone)."""
    return torch.is_grad_enabled() and (
        q.requires_grad or k.requires_grad or v.requires_grad or (sink is not None and sink.requires_grad)
    )


def _attention(q, k, v, sink, cu_q, cu_k, max_q, max_k, scale, wl, wr, return_lse, deterministic):
    code, grad = requested_backend_code(), needs_grad(q, k, v, sink)
    if code == AUTOTUNE:
        code = _tuned_code((q, k, v, sink, cu_q, cu_k, max_q, max_k, scale, wl, wr), deterministic, grad)
    args = (q, k, v, sink, cu_q, cu_k, max_q, max_k, scale, wl, wr, code)
    if grad:
        if native.eager_cpp_autograd():
            out, lse = _train_op(*args, bool(deterministic))
        else:
            out, lse = FlashAttnFunction.apply(*args, bool(deterministic))
    else:
        out, lse = _fwd_op(*args)
    return (out, lse) if return_lse else out


@native.raises_python_errors
def flash_attn_func(
    q,
    k,
    v,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    bias=None,
    alibi_slopes=None,
    deterministic=False,
    return_lse=False,
    return_attn_probs=False,
    sink=None,
):
    """Softmax attention ``softmax(q @ k^T * softmax_scale + mask) @ v`` of ``[B, S, H, D]`` tensors.

    Args:
        q: ``[B, Sq, Hq, D]``; k: ``[B, Sk, Hkv, D]``; v: ``[B, Sk, Hkv, Dv]``, float16 or bfloat16,
            ``Hq`` a multiple of ``Hkv`` (GQA/MQA). ``(D, Dv)`` in :data:`HEAD_DIMS` (64, 96, 128,
            192, 256 and MLA's (192, 128)). Any strides with a unit last one are read in place, so
            ``[S, B, H, D]`` or ``[B, H, S, D]`` storage passed as ``.transpose`` views costs no copy.
        softmax_scale: default ``D ** -0.5``.
        causal: key ``j`` visible from query ``i`` only if ``j <= i + Sk - Sq`` (bottom-right
            aligned, as FlashAttention); the same as ``window_size[1] = 0``.
        window_size: ``(left, right)``; key ``j`` is visible from query ``i`` iff
            ``i + Sk - Sq - left <= j <= i + Sk - Sq + right``; -1 leaves a side unbounded.
        deterministic: a bitwise-reproducible backward. With the backend unset the backward
            then runs on TURBO (its separate dQ kernel instead of the unordered float32 sums it
            uses at head dims 128/128); a forced CUDNN uses its deterministic algorithm (a
            workspace of B*Hq*Sq*Sk*2 bytes on Hopper; not with ``sink``).
        return_lse: also return the float32 log-sum-exp ``[B, Hq, Sq]`` (natural log; ``+inf`` for
            a query that sees no key and has no sink).
        sink: optional ``[Hq]`` per-head logit (GPT-OSS attention sinks; cast to float32) that joins
            each softmax denominator; differentiable. With the backend unset and head dim 64 the
            backward then runs on TURBO (2.5x faster than cuDNN's there), the forward on cuDNN.
        dropout_p, bias, alibi_slopes, return_attn_probs: not supported (``NotImplementedError``
            unless left at their defaults).

    Returns ``out`` ``[B, Sq, Hq, Dv]`` (contiguous, q's dtype), or ``(out, lse)`` with ``return_lse``.
    Queries that see no key give zeros. Differentiable in q, k, v and sink.
    """
    op = "flash_attn_func"
    scale, wl, wr, sink = _common_args(
        op, q, dropout_p, softmax_scale, causal, window_size, bias, alibi_slopes, return_attn_probs, sink
    )
    if not (_tensors(q, k, v, sink) and q.dim() == 4 and k.dim() == 4):
        _check_args(q, k, v, sink, None, None, 0, 0, scale, wl, wr)  # names what is wrong
    return _attention(q, k, v, sink, None, None, q.shape[1], k.shape[1], scale, wl, wr, return_lse, deterministic)


@native.raises_python_errors
def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    bias=None,
    alibi_slopes=None,
    deterministic=False,
    return_lse=False,
    return_attn_probs=False,
    sink=None,
):
    """:func:`flash_attn_func` over sequences packed back to back (the "thd" layout).

    Args:
        q: ``[Tq, Hq, D]``; k: ``[Tk, Hkv, D]``; v: ``[Tk, Hkv, Dv]``.
        cu_seqlens_q, cu_seqlens_k: ``[num_seqs + 1]`` int32 (int64 is converted) offsets of the
            sequences on q's device; sequences may be empty and q/k lengths may differ per sequence
            (the causal/window mask is bottom-right aligned per sequence).
        max_seqlen_q, max_seqlen_k: host ints, upper bounds of the sequence lengths (no device sync).
        The rest as :func:`flash_attn_func`.

    Returns ``out`` ``[Tq, Hq, Dv]``, or ``(out, lse)`` with ``lse`` float32 ``[Hq, Tq]``.
    """
    op = "flash_attn_varlen_func"
    scale, wl, wr, sink = _common_args(
        op, q, dropout_p, softmax_scale, causal, window_size, bias, alibi_slopes, return_attn_probs, sink
    )
    cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k = packed_offsets(
        op, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k
    )
    if not _tensors(q, k, v, sink, cu_seqlens_q, cu_seqlens_k):
        _check_args(q, k, v, sink, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, wl, wr)
    return _attention(
        q, k, v, sink, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, wl, wr, return_lse, deterministic
    )


def packed_offsets(op, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
    """The varlen arguments as the native ops take them: int32 offsets (int64, torch's default
    integer type, is converted; one tensor given for both stays one, as cuDNN's packed path needs
    to see) and host-int bounds."""
    if cu_seqlens_q is None or cu_seqlens_k is None:
        raise ValueError(
            f"{op}: arguments 'cu_seqlens_q' and 'cu_seqlens_k' are required (use the fixed-length function without "
            "them)"
        )
    same = cu_seqlens_k is cu_seqlens_q
    if isinstance(cu_seqlens_q, torch.Tensor) and cu_seqlens_q.dtype == torch.int64:
        cu_seqlens_q = cu_seqlens_q.to(torch.int32)
    if same:
        cu_seqlens_k = cu_seqlens_q
    elif isinstance(cu_seqlens_k, torch.Tensor) and cu_seqlens_k.dtype == torch.int64:
        cu_seqlens_k = cu_seqlens_k.to(torch.int32)
    if type(max_seqlen_q) is not int or type(max_seqlen_k) is not int:
        max_seqlen_q, max_seqlen_k = (
            _host_int(op, "max_seqlen_q", max_seqlen_q),
            _host_int(op, "max_seqlen_k", max_seqlen_k),
        )
    return cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k


def _host_int(op, name, n):
    if _is_int(n):
        return n
    if isinstance(n, torch.Tensor) and n.dim() == 0 and not n.is_floating_point():
        return int(n)  # a device scalar costs a sync: pass a host int
    try:
        return operator.index(n)  # numpy integers
    except TypeError:
        raise TypeError(f"{op}: argument '{name}' must be an int, got {type(n).__name__}") from None
