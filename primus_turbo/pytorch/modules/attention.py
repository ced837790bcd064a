"""turbo.modules.TurboAttention: core attention (no projections) on turbo.ops.flash_attn_func and
turbo.ops.flash_attn_varlen_func (or their FP8 forms), for the layouts models keep q, k and v in."""

import torch
from torch import nn

from primus_turbo.pytorch.ops.attention import flash_attn_func, flash_attn_varlen_func
from primus_turbo.pytorch.ops.attention_fp8 import block_rows, flash_attn_fp8_func, flash_attn_varlen_fp8_func
from primus_turbo.pytorch.ops.attention_usp import flash_attn_fp8_usp_func, flash_attn_usp_func

__all__ = ["TurboAttention"]

# How each layout's [.., S, .., H, ..] tensor maps to the op's [B, S, H, D]: the transpose is a view
# (the op reads strided q, k, v in place), and the same transpose brings the output back.
_TRANSPOSE = {"bshd": None, "sbhd": (0, 1), "bhsd": (1, 2), "thd": None}


class TurboAttention(nn.Module):
    """``softmax(q k^T * softmax_scale + mask) v`` for q, k, v already projected into heads.

    The positional arguments are the original library's (``dropout_p``, ``softmax_scale``,
    ``causal``, ``window_size``, ``alibi_slopes``, ``deterministic``, ``return_lse``,
    ``return_attn_probs``, ``fp8_config``, ``ulysses_group``, ``ring_group``). ``fp8_config``
    (a BLOCKWISE ``Float8QuantConfig``) runs ``flash_attn_fp8_func``: q, k, v quantized to FP8
    blockwise in the forward. ``ulysses_group`` / ``ring_group`` make it context-parallel
    (:func:`flash_attn_usp_func`, or :func:`flash_attn_fp8_usp_func` with ``fp8_config``): q, k, v
    are this rank's shard of the sequence; not with layout ``"thd"`` or sinks. Dropout (in training
    mode), ALiBi and attention probabilities are not implemented and raise ``NotImplementedError``
    when asked for; in eval mode ``dropout_p`` is ignored, as ``nn.Dropout`` does.

    Keyword-only:
        layout: ``"bshd"`` (default), ``"sbhd"`` (Megatron), ``"bhsd"`` (Hugging Face) or ``"thd"``
            (packed sequences, with ``cu_seqlens_q/k`` in ``forward``). Inputs are read in place
            through their strides; the output comes back in the same layout, as a view of the
            op's contiguous ``[B, S, H, Dv]`` result (``.reshape`` it to merge heads).
        learnable_sink, num_heads: a learnable per-head attention-sink logit (GPT-OSS), the
            float32 parameter ``sinks`` of shape ``[num_heads]`` (the heads of q), zero-initialized.
        seq_layout: with a ring group, which tokens each rank holds (``"contiguous"`` or the
            load-balanced ``"zigzag"``; :func:`flash_attn_usp_func`).
    """

    def __init__(
        self,
        dropout_p=0.0,
        softmax_scale=None,
        causal=False,
        window_size=(-1, -1),
        alibi_slopes=None,
        deterministic=False,
        return_lse=False,
        return_attn_probs=False,
        fp8_config=None,
        ulysses_group=None,
        ring_group=None,
        *,
        layout: str = "bshd",
        learnable_sink: bool = False,
        num_heads: int | None = None,
        seq_layout: str = "contiguous",
        device=None,
        dtype=None,
    ):
        super().__init__()
        if fp8_config is not None:
            block_rows("TurboAttention", fp8_config)  # refuses what FP8 attention does not take, here
        self.fp8_config = fp8_config
        if layout not in _TRANSPOSE:
            raise ValueError(f"TurboAttention: argument 'layout' is {layout!r}; expected one of {sorted(_TRANSPOSE)}")
        self.ulysses_group, self.ring_group, self.seq_layout = ulysses_group, ring_group, seq_layout
        if self._context_parallel() and (layout == "thd" or learnable_sink):
            raise NotImplementedError(
                "TurboAttention: context parallelism (arguments 'ulysses_group', 'ring_group') is not implemented for "
                "packed sequences (layout 'thd') or attention sinks"
            )
        self.dropout_p = dropout_p
        self.softmax_scale = softmax_scale
        self.causal = causal
        try:
            self.window_size = tuple(window_size)
            if len(self.window_size) != 2:
                raise TypeError
        except TypeError:
            raise TypeError(
                f"TurboAttention: argument 'window_size' must be a pair (left, right), got {window_size!r}"
            ) from None
        self.alibi_slopes = alibi_slopes
        self.deterministic = deterministic
        self.return_lse = return_lse
        self.return_attn_probs = return_attn_probs
        self.layout = layout
        if learnable_sink:
            if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
                raise ValueError(
                    f"TurboAttention: learnable_sink needs 'num_heads' (the heads of q), got {num_heads!r}"
                )
            if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
                raise TypeError(f"TurboAttention: argument 'dtype' (of the sinks) must be a float dtype, got {dtype!r}")
            self.sinks = nn.Parameter(torch.empty(num_heads, device=device, dtype=dtype or torch.float32))
        else:
            self.register_parameter("sinks", None)
        self.reset_parameters()

    def _context_parallel(self) -> bool:
        return self.ulysses_group is not None or self.ring_group is not None

    def reset_parameters(self) -> None:
        if self.sinks is not None:
            with torch.no_grad():
                self.sinks.zero_()

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        bias: torch.Tensor | None = None,
        *,
        cu_seqlens_q: torch.Tensor | None = None,
        cu_seqlens_k: torch.Tensor | None = None,
        max_seqlen_q: int | None = None,
        max_seqlen_k: int | None = None,
        sink: torch.Tensor | None = None,
    ):
        """q, k, v in ``self.layout``; returns the output in the same layout (and the float32
        log-sum-exp with ``return_lse``). ``sink`` overrides the module's ``sinks``. For ``"thd"``,
        ``max_seqlen_q/k`` default to the longest sequence, which costs a device synchronization."""
        kwargs = {
            # As nn.Dropout: no dropout in eval mode (attention dropout itself is not implemented).
            "dropout_p": self.dropout_p if self.training else 0.0,
            "softmax_scale": self.softmax_scale,
            "causal": self.causal,
            "window_size": self.window_size,
            "bias": bias,
            "alibi_slopes": self.alibi_slopes,
            "deterministic": self.deterministic,
            "return_lse": self.return_lse,
            "return_attn_probs": self.return_attn_probs,
            "sink": sink if sink is not None else self.sinks,
        }
        packed = cu_seqlens_q is not None or cu_seqlens_k is not None
        if packed != (self.layout == "thd"):
            raise ValueError(
                "TurboAttention: cu_seqlens_q/cu_seqlens_k are required with layout 'thd' and only with it "
                f"(layout is {self.layout!r})"
            )
        if packed:
            if max_seqlen_q is None:
                max_seqlen_q = _longest(cu_seqlens_q)
            if max_seqlen_k is None:
                max_seqlen_k = _longest(cu_seqlens_k)
            fn = flash_attn_varlen_func
            if self.fp8_config is not None:
                fn, kwargs["fp8_config"] = flash_attn_varlen_fp8_func, self.fp8_config
            return fn(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, **kwargs)
        dims = _TRANSPOSE[self.layout]
        if dims is not None:
            for name, t in (("q", q), ("k", k), ("v", v)):
                if not isinstance(t, torch.Tensor) or t.dim() != 4:
                    raise ValueError(
                        f"TurboAttention: argument '{name}' must be a 4-D tensor in layout {self.layout!r}, got "
                        f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}"
                    )
            q, k, v = q.transpose(*dims), k.transpose(*dims), v.transpose(*dims)
        if self._context_parallel():
            if kwargs.pop("sink") is not None:
                raise NotImplementedError("TurboAttention: argument 'sink' is not supported with context parallelism")
            groups = {"ulysses_group": self.ulysses_group, "ring_group": self.ring_group}
            if self.fp8_config is not None:
                result = flash_attn_fp8_usp_func(q, k, v, fp8_config=self.fp8_config, **kwargs, **groups)
            else:
                result = flash_attn_usp_func(q, k, v, **kwargs, **groups, seq_layout=self.seq_layout)
        elif self.fp8_config is not None:
            result = flash_attn_fp8_func(q, k, v, fp8_config=self.fp8_config, **kwargs)
        else:
            result = flash_attn_func(q, k, v, **kwargs)
        if dims is None:
            return result
        if self.return_lse:
            return result[0].transpose(*dims), result[1]
        return result.transpose(*dims)

    def extra_repr(self) -> str:
        heads = f", sinks={self.sinks.shape[0]}" if self.sinks is not None else ""
        heads += f", fp8 blocks of {self.fp8_config.block_size} rows" if self.fp8_config is not None else ""
        return (
            f"layout={self.layout!r}, causal={self.causal}, window_size={self.window_size}, "
            f"softmax_scale={self.softmax_scale}{heads}"
        )


def _longest(cu_seqlens) -> int:
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"TurboAttention: cu_seqlens must be a torch.Tensor, got {type(cu_seqlens).__name__}")
    return int((cu_seqlens[1:] - cu_seqlens[:-1]).max()) if cu_seqlens.numel() > 1 else 0
