"""Hugging Face transformers: ``attn_implementation="primus_turbo"`` runs a model's attention on
turbo.ops.flash_attn_func / flash_attn_varlen_func.

    from primus_turbo.pytorch.integrations.hf import register_hf_attention
    register_hf_attention()
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="primus_turbo")

Inputs are handled as transformers' FlashAttention path handles them: GQA without repeating k/v,
MLA's smaller v head dim natively, ``sliding_window`` (a query sees ``sliding_window`` keys,
itself included), attention sinks (``s_aux``, else ``module.sinks``), padding masks and packed
(padding-free) batches through the varlen op. Dropout and soft-capping raise NotImplementedError.
"""

import torch

from primus_turbo.pytorch.ops.attention import flash_attn_func, flash_attn_varlen_func

__all__ = ["ATTN_IMPLEMENTATION", "primus_turbo_attention_forward", "register_hf_attention"]

ATTN_IMPLEMENTATION = "primus_turbo"


def register_hf_attention(name: str = ATTN_IMPLEMENTATION) -> str:
    """Registers :func:`primus_turbo_attention_forward` as ``attn_implementation=name`` (and, where
    transformers builds masks per implementation, FlashAttention's mask: None or a 2-D padding
    mask). Returns ``name``. Needs transformers >= 4.48."""
    try:
        from transformers import AttentionInterface
    except ImportError as e:
        raise ImportError(
            "register_hf_attention needs Hugging Face transformers >= 4.48 (with AttentionInterface): "
            "pip install 'transformers>=4.48'"
        ) from e
    AttentionInterface.register(name, primus_turbo_attention_forward)
    try:  # transformers >= 4.53: without a mask function registered, a custom name gets no mask at all
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, flash_attention_mask
    except ImportError:  # older versions build a 4-D mask, which the forward refuses with a clear error
        pass
    else:
        ALL_MASK_ATTENTION_FUNCTIONS.register(name, flash_attention_mask)
    return name


def primus_turbo_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    softcap: float | None = None,
    is_causal: bool | None = None,
    s_aux: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function interface: query ``[B, Hq, Sq, D]``, key/value
    ``[B, Hkv, Sk, D(v)]``; returns ``(attn_output [B, Sq, Hq, Dv], None)``."""
    if dropout:
        raise NotImplementedError(
            f"primus_turbo attention: dropout ({dropout}) is not supported; set attention_dropout=0"
        )
    if softcap is not None:
        raise NotImplementedError("primus_turbo attention: logit soft-capping ('softcap') is not supported")
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise TypeError(f"primus_turbo attention: argument '{name}' must be a 4-D [B, H, S, D] torch.Tensor")
    if sliding_window is not None and (isinstance(sliding_window, bool) or not isinstance(sliding_window, int)
                                       or sliding_window < 0):
        raise ValueError(f"primus_turbo attention: 'sliding_window' must be a positive int or None, got {sliding_window!r}")
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    sink = s_aux if s_aux is not None else getattr(module, "sinks", None)
    # transformers' window counts the query itself: sliding_window keys in all.
    window = (sliding_window - 1, sliding_window - 1) if sliding_window else (-1, -1)
    # [B, H, S, D] -> [B, S, H, D] views: the op reads the strides, nothing is copied.
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    if q.dtype == torch.float32 and torch.is_autocast_enabled("cuda"):  # e.g. PEFT's float32 norms
        dtype = torch.get_autocast_dtype("cuda")
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    kw = {"softmax_scale": scaling, "causal": bool(causal), "window_size": window, "sink": sink}

    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if (cu_q is None) != (cu_k is None):
        raise ValueError("primus_turbo attention: pass both cu_seq_lens_q and cu_seq_lens_k (packed sequences) or neither")
    if cu_q is not None and q.shape[0] != 1:
        raise ValueError(
            f"primus_turbo attention: packed sequences (cu_seq_lens_q / cu_seq_lens_k) come in one row of the batch; "
            f"got a batch of {q.shape[0]}"
        )
    if cu_q is None and attention_mask is None and q.shape[0] == 1 and 1 < q.shape[1] == k.shape[1]:
        cu_q = cu_k = _packed_offsets(kwargs.get("position_ids"))
    if cu_q is not None and cu_k is not None:  # a padding-free batch: sequences packed in one row
        max_q = kwargs.get("max_length_q") or _longest(cu_q)
        max_k = kwargs.get("max_length_k") or _longest(cu_k)
        out = flash_attn_varlen_func(q[0], k[0], v[0], cu_q, cu_k, max_q, max_k, **kw)
        return out.unsqueeze(0), None
    if attention_mask is not None:
        return _padded(q, k, v, attention_mask, kw), None
    return flash_attn_func(q, k, v, **kw), None


def _packed_offsets(position_ids):
    """Sequence offsets of a packed row whose positions restart at 0 (as transformers' FlashAttention
    path reads them; it reads the values, which synchronizes), or None for one plain sequence."""
    if position_ids is None or position_ids.dim() != 2 or position_ids.shape[0] != 1:
        return None
    pos = position_ids[0]
    if bool((pos[1:] > pos[:-1]).all()):
        return None
    starts = torch.nonzero(pos == 0).flatten().to(torch.int32)
    if starts.numel() == 0 or int(starts[0]) != 0:
        return None
    end = torch.tensor([pos.shape[0]], dtype=torch.int32, device=pos.device)
    return torch.cat((starts, end))


def _longest(cu) -> int:
    if not isinstance(cu, torch.Tensor) or cu.dim() != 1 or cu.shape[0] < 2:
        raise ValueError(
            "primus_turbo attention: 'cu_seq_lens_q' / 'cu_seq_lens_k' must be 1-D tensors of num_seqs + 1 >= 2 offsets"
        )
    return int((cu[1:] - cu[:-1]).max())


def _padded(q, k, v, mask, kw):
    """A padded batch (2-D mask [B, Sk], True = a real token): the real tokens go through the varlen
    op and the padding rows of the output are zero."""
    if mask.dim() != 2:
        raise NotImplementedError(
            f"primus_turbo attention takes no mask or a 2-D padding mask, got one of shape {tuple(mask.shape)}: "
            "use transformers >= 4.53, where register_hf_attention() asks for FlashAttention's masks"
        )
    b, sq, sk = q.shape[0], q.shape[1], k.shape[1]
    if mask.shape[0] != b or mask.shape[1] < sk:
        raise ValueError(
            f"primus_turbo attention: 'attention_mask' has shape {tuple(mask.shape)}; expected [{b}, >= {sk}] "
            "(batch, key length)"
        )
    if b == 0 or sq == 0:
        return q.new_zeros(b, sq, q.shape[2], v.shape[-1])
    mask_k = mask[:, -sk:].bool()
    mask_q = mask_k[:, -sq:]  # queries are the last tokens (left padding when decoding), as in transformers
    cu_k, max_k = _offsets(mask_k)
    # Training (sq == sk): the same tokens, so one offsets tensor for both, which lets the CUDNN
    # backend take the packed call (it needs q's and k's lengths known equal).
    cu_q, max_q = (cu_k, max_k) if sq == sk else _offsets(mask_q)
    out = flash_attn_varlen_func(q[mask_q], k[mask_k], v[mask_k], cu_q, cu_k, max_q, max_k, **kw)
    full = out.new_zeros(b, sq, *out.shape[1:])
    return full.index_put((mask_q,), out)


def _offsets(mask):
    lens = mask.sum(-1, dtype=torch.int32)
    return torch.nn.functional.pad(lens.cumsum(0, dtype=torch.int32), (1, 0)), int(lens.max())
