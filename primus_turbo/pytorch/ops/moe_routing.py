"""turbo.ops.fused_group_topk_routing_with_aux_score, indices_to_multihot, tokens_per_expert_to_mask:
MoE routing on the library's CUDA kernels (kernels/moe_routing/routing.cuh), forward and backward."""

import torch

from primus_turbo.pytorch.core import library, native
from primus_turbo.pytorch.ops._checks import check_cuda_tensors

__all__ = ["fused_group_topk_routing_with_aux_score", "indices_to_multihot", "tokens_per_expert_to_mask"]

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_INDEX_DTYPES = (torch.int32, torch.int64)
_SCORE_FUNCTIONS = ("sigmoid", "softmax")
MAX_EXPERTS = 1024
MAX_GROUPS = 64


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# ---- native ops (csrc/bindings/torch/moe_routing_ops.cpp) and their fake implementations ---------


def _routing_fwd_fake(logits, topk, groups, selected_groups, softmax, scaling):
    return (
        logits.new_empty(logits.shape),
        logits.new_empty(logits.shape),
        logits.new_empty(logits.shape, dtype=torch.bool),
    )


library.register_fake("moe_routing_fwd", _routing_fwd_fake)
_routing_fwd = native.ops.moe_routing_fwd.default


def _routing_bwd_fake(logits, routing_map, grad_probs, grad_scores, topk, softmax, scaling):
    return logits.new_empty(logits.shape)


library.register_fake("moe_routing_bwd", _routing_bwd_fake)
_routing_bwd = native.ops.moe_routing_bwd.default


def _multihot_fwd_fake(indices, probs, num_experts, float32_out):
    t = indices.shape[0]
    out_dtype = torch.float32 if float32_out else probs.dtype
    return indices.new_empty((t, num_experts), dtype=torch.bool), probs.new_empty((t, num_experts), dtype=out_dtype)


library.register_fake("indices_to_multihot_fwd", _multihot_fwd_fake)
_multihot_fwd = native.ops.indices_to_multihot_fwd.default


def _multihot_bwd_fake(indices, grad_probs_out, dtype):
    return grad_probs_out.new_empty(indices.shape, dtype=dtype)


library.register_fake("indices_to_multihot_bwd", _multihot_bwd_fake)
_multihot_bwd = native.ops.indices_to_multihot_bwd.default


def _tokens_mask_fake(tokens_per_expert, num_tokens):
    return tokens_per_expert.new_empty((num_tokens,), dtype=torch.int64)


library.register_fake("tokens_per_expert_to_mask", _tokens_mask_fake)
_tokens_mask = native.ops.tokens_per_expert_to_mask.default


# ---- autograd ----------------------------------------------------------------------------------


class GroupTopkRoutingFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, topk: int, groups: int, selected_groups: int, softmax: bool, scaling: float):
        scores, probs, routing_map = _routing_fwd(logits, topk, groups, selected_groups, softmax, scaling)
        ctx.mark_non_differentiable(routing_map)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(logits, routing_map)
        ctx.args = (topk, softmax, scaling)
        return scores, probs, routing_map

    @staticmethod
    def backward(ctx, grad_scores, grad_probs, _grad_map):
        logits, routing_map = ctx.saved_tensors
        if grad_scores is None and grad_probs is None:
            return None, None, None, None, None, None

        def prep(g):
            return None if g is None else g.to(logits.dtype).contiguous()

        topk, softmax, scaling = ctx.args
        grad = _routing_bwd(logits, routing_map, prep(grad_probs), prep(grad_scores), topk, softmax, scaling)
        return grad, None, None, None, None, None


class IndicesToMultihotFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, indices, probs, num_experts: int, float32_out: bool):
        multihot, probs_out = _multihot_fwd(indices, probs, num_experts, float32_out)
        ctx.mark_non_differentiable(multihot)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(indices)
        ctx.probs_dtype = probs.dtype
        return multihot, probs_out

    @staticmethod
    def backward(ctx, _grad_multihot, grad_probs_out):
        if grad_probs_out is None:
            return None, None, None, None
        (indices,) = ctx.saved_tensors
        grad = _multihot_bwd(indices, grad_probs_out.contiguous(), ctx.probs_dtype)
        return None, grad, None, None


# ---- public API --------------------------------------------------------------------------------


def _check_routing_args(logits, topk, groups, selected_groups, score_function) -> None:
    op = "fused_group_topk_routing_with_aux_score"
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"{op}: argument 'logits' must be a torch.Tensor, got {type(logits).__name__}")
    if logits.dtype not in _DTYPES:
        raise TypeError(f"{op}: argument 'logits' has dtype {logits.dtype}; expected float32, float16 or bfloat16")
    if logits.dim() != 2:
        raise ValueError(f"{op}: argument 'logits' has shape {tuple(logits.shape)}; expected [tokens, experts]")
    experts = logits.shape[1]
    if not 1 <= experts <= MAX_EXPERTS:
        raise ValueError(f"{op}: argument 'logits' has {experts} experts (last dimension); expected 1 to {MAX_EXPERTS}")
    if score_function not in _SCORE_FUNCTIONS:
        raise ValueError(f"{op}: argument 'score_function' is {score_function!r}; expected 'sigmoid' or 'softmax'")
    for name, v in (("topk", topk), ("groups", groups), ("selected_groups", selected_groups)):
        if not _is_int(v):
            raise TypeError(f"{op}: argument '{name}' must be an int, got {v!r}")
    if not 1 <= topk <= experts:
        raise ValueError(f"{op}: argument 'topk' is {topk}; expected 1 to the number of experts ({experts})")
    if not 1 <= groups <= MAX_GROUPS:
        raise ValueError(f"{op}: argument 'groups' is {groups}; expected 1 to {MAX_GROUPS}")
    if experts % groups:
        raise ValueError(f"{op}: argument 'groups' ({groups}) must divide the number of experts ({experts})")
    if not 1 <= selected_groups <= groups:
        raise ValueError(f"{op}: argument 'selected_groups' is {selected_groups}; expected 1 to groups ({groups})")
    if topk < selected_groups:
        raise ValueError(
            f"{op}: argument 'topk' ({topk}) must be at least selected_groups ({selected_groups}): "
            "a group's score sums its top topk // selected_groups experts"
        )
    if topk > selected_groups * (experts // groups):
        raise ValueError(
            f"{op}: argument 'topk' ({topk}) exceeds the experts of the selected groups "
            f"(selected_groups * experts / groups = {selected_groups * (experts // groups)})"
        )
    check_cuda_tensors(op, logits=logits)


@native.raises_python_errors
def fused_group_topk_routing_with_aux_score(
    logits: torch.Tensor,
    topk: int,
    groups: int = 1,
    selected_groups: int = 1,
    score_function: str = "sigmoid",
    scaling_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Group-limited top-k MoE routing (DeepSeek-V3 style) with the aux-loss scores, in one kernel.

    Args:
        logits: router logits ``[tokens, experts]`` (float32, float16 or bfloat16; experts <= 1024).
        topk: experts chosen per token.
        groups: the experts split into ``groups`` contiguous groups (must divide experts, <= 64).
            ``None`` (or ``selected_groups=None``) means no group limit.
        selected_groups: groups a token may route to; a group's score is the sum of its top
            ``topk // selected_groups`` scores. Needs ``selected_groups <= topk <=
            selected_groups * experts / groups``.
        score_function: ``"sigmoid"`` or ``"softmax"`` (over all experts).
        scaling_factor: multiplies the probabilities (``None``: 1).

    Returns ``(scores, probs, routing_map)``, all ``[tokens, experts]``:
        scores: the per-token scores of the aux loss (logits' dtype): softmax, or for sigmoid
            ``s / (s.sum() + 1e-20)`` when ``topk > 1`` (plain ``s`` for ``topk == 1``);
        probs: dense routing probabilities (logits' dtype, 0 off the chosen experts): softmax:
            ``s * scaling``; sigmoid: the chosen ``s`` normalized to sum 1 (when ``topk > 1``)
            times ``scaling``;
        routing_map: bool, True on the chosen experts.

    Scores, ranking and sums are fp32. Ties rank the lower expert (group) index first, so indices
    are deterministic. Differentiable wrt ``logits`` through ``scores`` and ``probs``. No host
    synchronization; CUDA-graph capturable.
    """
    if groups is None or selected_groups is None:
        groups, selected_groups = 1, 1
    if scaling_factor is None:
        scaling_factor = 1.0
    _check_routing_args(logits, topk, groups, selected_groups, score_function)
    if isinstance(scaling_factor, bool) or not isinstance(scaling_factor, (int, float)):
        raise TypeError(
            "fused_group_topk_routing_with_aux_score: argument 'scaling_factor' must be a number, "
            f"got {scaling_factor!r}"
        )
    return GroupTopkRoutingFunction.apply(
        logits.contiguous(),
        int(topk),
        int(groups),
        int(selected_groups),
        score_function == "softmax",
        float(scaling_factor),
    )


@native.raises_python_errors
def indices_to_multihot(
    indices: torch.Tensor, probs_indices: torch.Tensor, num_of_local_experts: int, fused: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k indices and their probabilities -> multihot routing map and dense probabilities.

    Args:
        indices: ``[tokens, topk]`` int32/int64 expert indices; ``-1`` (any index outside
            ``[0, num_of_local_experts)``) marks a dropped route and is skipped.
        probs_indices: ``[tokens, topk]`` probabilities (float32, float16 or bfloat16).
        num_of_local_experts: the number of experts (columns of the outputs).
        fused: the dtype of the dense probabilities: ``probs_indices``' dtype when True, float32
            when False (as the original's unfused path). Both run the same kernel.

    Returns ``(routing_map, probs)``: bool ``[tokens, experts]`` and ``[tokens, experts]``
    probabilities (0 where not routed). A repeated index in a row takes its last position's
    probability. Differentiable wrt ``probs_indices`` (the gradient gathers back to the positions
    used; 0 for skipped ones).
    """
    op = "indices_to_multihot"
    if not isinstance(indices, torch.Tensor) or not isinstance(probs_indices, torch.Tensor):
        raise TypeError(f"{op}: arguments 'indices' and 'probs_indices' must be torch.Tensors")
    if indices.dtype not in _INDEX_DTYPES:
        raise TypeError(f"{op}: argument 'indices' has dtype {indices.dtype}; expected int32 or int64")
    if probs_indices.dtype not in _DTYPES:
        raise TypeError(
            f"{op}: argument 'probs_indices' has dtype {probs_indices.dtype}; expected float32, float16 or bfloat16"
        )
    if indices.dim() != 2:
        raise ValueError(f"{op}: argument 'indices' has shape {tuple(indices.shape)}; expected [tokens, topk]")
    if probs_indices.shape != indices.shape:
        raise ValueError(
            f"{op}: argument 'probs_indices' has shape {tuple(probs_indices.shape)}; expected the shape of 'indices' "
            f"{tuple(indices.shape)}"
        )
    if not _is_int(num_of_local_experts) or num_of_local_experts < 0:
        raise ValueError(
            f"{op}: argument 'num_of_local_experts' must be a non-negative int, got {num_of_local_experts!r}"
        )
    check_cuda_tensors(op, indices=indices, probs_indices=probs_indices)
    return IndicesToMultihotFunction.apply(
        indices.contiguous(), probs_indices.contiguous(), int(num_of_local_experts), not fused
    )


@native.raises_python_errors
def tokens_per_expert_to_mask(tokens_per_expert: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """int64 ``[num_tokens]`` mask: 1 for the first ``tokens_per_expert.sum()`` positions, 0 after
    (the valid rows of a padded, permuted token buffer). ``tokens_per_expert``: int32/int64
    ``[experts]`` on the GPU; the sum is taken on the device (no host synchronization)."""
    op = "tokens_per_expert_to_mask"
    if not isinstance(tokens_per_expert, torch.Tensor):
        raise TypeError(f"{op}: argument 'tokens_per_expert' must be a torch.Tensor")
    if tokens_per_expert.dtype not in _INDEX_DTYPES:
        raise TypeError(
            f"{op}: argument 'tokens_per_expert' has dtype {tokens_per_expert.dtype}; expected int32 or int64"
        )
    if tokens_per_expert.dim() != 1:
        raise ValueError(
            f"{op}: argument 'tokens_per_expert' has shape {tuple(tokens_per_expert.shape)}; expected a 1-D [experts]"
        )
    if not (_is_int(num_tokens) or isinstance(num_tokens, torch.SymInt)) or num_tokens < 0:
        raise ValueError(f"{op}: argument 'num_tokens' must be a non-negative int, got {num_tokens!r}")
    check_cuda_tensors(op, tokens_per_expert=tokens_per_expert)
    return _tokens_mask(tokens_per_expert.contiguous(), num_tokens)
