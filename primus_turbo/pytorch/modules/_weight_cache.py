"""The quantized-weight cache of the FP8 layers (Float8Linear, GroupedLinear with an FP8 config):
the weight's two FP8 copies kept until the weight changes, so gradient accumulation and activation
recomputation quantize it once per optimizer step instead of once per forward."""

import copy
import weakref
from typing import Optional

import torch

from primus_turbo.pytorch.core.low_precision import Format, ScalingGranularity
from primus_turbo.pytorch.core.quantized_tensor import QuantizedTensor, QuantizedTensorPair, create_quantized_weight
from primus_turbo.pytorch.ops._quantized_operands import keep_transposed_qdata
from primus_turbo.pytorch.ops.quantization import quantize_fp8_row_and_transposed, quantize_fp8_with_amax

__all__ = ["QuantizedWeightCache"]


class _StraightThrough(torch.autograd.Function):
    """The cached quantized weight as a function of the weight: its gradient is the weight's."""

    @staticmethod
    def forward(ctx, weight, quantized):
        return quantized.detach()  # a fresh alias, so the cached tensor never gets a grad_fn

    @staticmethod
    def backward(ctx, grad):
        return grad, None


# Layers holding a quantized-weight cache: every torch optimizer step drops their caches (an
# optimizer that writes through ``param.data`` leaves the version counter where it was).
_CACHING_LAYERS = weakref.WeakSet()
_STEP_HOOK = None


def _drop_weight_caches(*_):
    for layer in list(_CACHING_LAYERS):
        if getattr(layer, "_weight_cache_fresh", False):  # made by the step that just ran (turbo.optim.FusedAdamW)
            layer._weight_cache_fresh = False
        else:
            layer.invalidate_weight_cache()


def _track(layer) -> None:
    global _STEP_HOOK
    _CACHING_LAYERS.add(layer)
    if _STEP_HOOK is None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        _STEP_HOOK = register_optimizer_step_post_hook(_drop_weight_caches)


class QuantizedWeightCache:
    """Mixin of an ``nn.Module`` with ``weight`` (``[N, K]`` or ``[G, N, K]``, used with
    ``trans_b=True``) and ``config`` (a Float8QuantConfig): ``weight_operand()`` is the weight, or
    with ``cache_quantized_weight`` its cached FP8 pair (along K for the forward, along N for the
    dgrad), rebuilt when the weight's storage, version counter, dtype, shape, device or the config
    change, and dropped by every torch optimizer step. Eager training only: under torch.compile,
    CUDA-graph capture and inference mode the weight is quantized per call."""

    def _init_weight_cache(self, enabled: bool) -> None:
        self.cache_quantized_weight = bool(enabled)
        self._weight_cache = None  # (key, data, data_t)
        self._weight_rows = None  # (key, (q, s, q_t, s_t)): a ROWWISE stack's kernel-ready copies
        self._weight_cache_fresh = False
        if self.cache_quantized_weight:
            _track(self)

    def invalidate_weight_cache(self) -> None:
        """Drops the cached FP8 copies of the weight; the next forward quantizes it again."""
        self._weight_cache = None
        self._weight_rows = None
        self._weight_cache_fresh = False

    def _apply(self, fn, *args, **kwargs):  # .to() / .cuda() / .half(): the copies would be stale
        self.invalidate_weight_cache()
        return super()._apply(fn, *args, **kwargs)

    def __getstate__(self):  # pickling and deepcopy leave the cache behind
        state = self.__dict__.copy()
        state["_weight_cache"] = None
        state["_weight_rows"] = None
        state["_weight_cache_fresh"] = False
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        if getattr(self, "cache_quantized_weight", False):
            _track(self)

    def _cache_key(self):
        w = self.weight
        return (w.data_ptr(), w._version, w.dtype, tuple(w.shape), w.device, self.config)

    def _fp8_dtype(self) -> torch.dtype:
        return torch.float8_e5m2 if self.config.format == Format.E5M2 else torch.float8_e4m3fn

    def _quantize_weight(self, amax=None, quantized=None):
        """Fills the cache with the weight's copies: quantized here (TENSORWISE: scaled by ``amax``,
        max |weight| reduced elsewhere, when given), or ``quantized`` = (q, scale_inv) made
        elsewhere along K exactly as here."""
        w, q_t = self.weight.detach(), None
        self._weight_rows = None  # one set of copies at a time
        with torch.no_grad():
            if quantized is None and self.config.granularity == ScalingGranularity.TENSORWISE and w.dim() == 2 and w.is_cuda:
                # The dgrad's transposed copy in the same pass (else a transpose of the FP8 copy per step).
                if amax is not None:
                    q, s, q_t = quantize_fp8_with_amax(w, self._fp8_dtype(), amax, transposed=True)
                else:
                    q, s, q_t, _ = quantize_fp8_row_and_transposed(w, self._fp8_dtype(), ScalingGranularity.TENSORWISE)
                quantized, amax = (q, s), None
            data, data_t = create_quantized_weight(w, self._fp8_dtype(), self.config, need_weight_transpose_cache=True,
                                                   amax=amax, quantized=quantized)
        key = self._cache_key()[:-1] + (copy.copy(self.config),)  # an in-place edit of config must not match
        self._weight_cache = (key, data, data_t)
        if q_t is not None:
            keep_transposed_qdata(data_t, q_t)

    def _cached_copies(self):
        """(data, data_t): the weight's FP8 copies for this optimizer step, made on first use."""
        if self._weight_cache is None or self._weight_cache[0] != self._cache_key():
            self._quantize_weight()
        return self._weight_cache[1], self._weight_cache[2]

    def _rows_copies(self):
        """A ROWWISE weight stack's two copies for this optimizer step in the grouped kernels' own
        form, ``(q [G, N, K], s [G, N], q_t [G, K, N], s_t [G, K])``, from one native pass at first
        use (the QuantizedTensor copies would take a transpose of the weight and two of their FP8
        data); None where that form does not apply. Dropped with the other copies."""
        from primus_turbo.pytorch.ops.grouped_gemm_fp8 import grouped_weight_rows, weight_rows_native_ok

        if not weight_rows_native_ok(self.weight, self.config):
            return None
        key, held = self._cache_key(), getattr(self, "_weight_rows", None)  # absent in a layer pickled before
        if held is None or held[0] != key:
            self._weight_cache = None  # one set of copies at a time
            held = self._weight_rows = (key[:-1] + (copy.copy(self.config),), grouped_weight_rows(self.weight, self._fp8_dtype()))
        return held[1]

    def step_refresh(self) -> Optional[str]:
        """How an optimizer that knows this protocol (turbo.optim.FusedAdamW) makes the weight's FP8
        copy in its update, with the cache on and a plain weight: ``"amax"`` (TENSORWISE: it reports
        max |weight| for :meth:`refresh_weight_cache`), ``"blocks"`` (BLOCKWISE 128 x 128 weight
        blocks: it writes the copy itself, :meth:`refresh_weight_cache_blocks`), else None."""
        if not getattr(self, "cache_quantized_weight", False) or self.config is None:
            return None
        if isinstance(self.weight, QuantizedTensor) or self.weight.dim() < 1 or not self._weight_cache_applies():
            return None
        g = self.config.granularity
        if g == ScalingGranularity.TENSORWISE:
            return "amax"
        if g == ScalingGranularity.BLOCKWISE and self.config.block_size == 128:
            return "blocks"
        return None

    def refresh_weight_cache(self, amax: torch.Tensor) -> None:
        """Quantizes the just-updated weight into the cache with ``amax`` (float32 [1] on its
        device: max |weight| as the optimizer stored it) instead of an amax pass over the weight;
        the optimizer step's hook keeps this copy."""
        self._quantize_weight(amax=amax)
        self._weight_cache_fresh = True

    def refresh_weight_cache_blocks(self, qdata: torch.Tensor, scale_inv: torch.Tensor,
                                    qdata_t: Optional[torch.Tensor] = None) -> None:
        """Takes the just-updated weight's FP8 copy in 128 x 128 blocks, written by the optimizer
        from its update (``qdata`` the weight's shape, ``scale_inv`` ``[ceil(rows/128),
        ceil(cols/128)]`` of the weight seen as ``[rows, cols]``), as the cache's copy; the
        optimizer step's hook keeps it. ``qdata_t``: the transposed copy (a ``[G, N, K]`` weight's
        ``[G, K, N]`` per expert, N a multiple of 128; an ``[N, K]`` weight's ``[K, N]``), kept as
        the dgrad's operand so no transpose of the FP8 weight runs in the step."""
        self._quantize_weight(quantized=(qdata, scale_inv))
        self._weight_cache_fresh = True
        if qdata_t is not None and qdata_t.numel():
            # The dgrad's restatement of the pair's copy along N reads it instead of transposing.
            keep_transposed_qdata(self._weight_cache[2], qdata_t)

    def _cached_weight(self) -> QuantizedTensorPair:
        w = self.weight
        data, data_t = self._cached_copies()
        if torch.is_grad_enabled() and w.requires_grad:
            data = _StraightThrough.apply(w, data)
        return QuantizedTensorPair(data, data_t)

    def _weight_cache_applies(self) -> bool:
        """Whether the cached FP8 form can hold this layer's weight (a layer whose weight it cannot
        express quantizes per call instead)."""
        return True

    def _weight_cached_now(self) -> bool:
        """Whether this call reads the per-step cache (eager training with a plain weight)."""
        return (
            getattr(self, "cache_quantized_weight", False)
            and not isinstance(self.weight, QuantizedTensor)
            and self._weight_cache_applies()
            and not torch.compiler.is_compiling()
            and not torch.is_inference_mode_enabled()  # inference tensors cannot serve a later backward
            # A captured graph would keep reading copies the next optimizer step frees or replaces.
            and not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())
        )

    def weight_operand(self):
        """What this layer's FP8 GEMM reads as its weight: the cached FP8 pair (eager training with
        ``cache_quantized_weight``; the weight's gradient flows through it) or the weight itself.
        Ops that take the layer's weight outside its forward (``turbo.ops.swiglu_mlp_fp8``) pass this."""
        return self._cached_weight() if self._weight_cached_now() else self.weight
