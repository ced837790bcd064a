"""Reference checks shared by the tests: the gates of ACCURACY.md."""

import torch

# (rtol/atol, minimum SNR in dB) per output dtype.
GATES = {
    torch.float32: (1e-4, None),
    torch.bfloat16: (1e-2, 45.0),
    torch.float16: (1e-2, 50.0),
}


def snr_db(out: torch.Tensor, ref: torch.Tensor) -> float:
    out64, ref64 = out.double(), ref.double()
    noise = (ref64 - out64).pow(2).sum().item()
    signal = ref64.pow(2).sum().item()
    if noise == 0:
        return float("inf")
    return 10.0 * torch.log10(torch.tensor(signal / noise)).item()


def assert_gate(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str = "output") -> None:
    """allclose at the dtype's tolerance and, for 16-bit types, the SNR floor; NaN/Inf fail."""
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    assert torch.isfinite(out).all() or not torch.isfinite(ref).all(), f"{what}: non-finite values"
    tol, min_snr = GATES[dtype]
    out64, ref64 = out.double(), ref.double()
    if not torch.allclose(out64, ref64, rtol=tol, atol=tol):
        err = (out64 - ref64).abs().max().item()
        raise AssertionError(f"{what}: max abs error {err:.3g} exceeds rtol=atol={tol}")
    if min_snr is not None and ref.numel() > 0:
        snr = snr_db(out, ref)
        assert snr >= min_snr, f"{what}: SNR {snr:.1f} dB < {min_snr} dB"


def poisoned(shape, dtype, device="cuda") -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def poison_allocator(nbytes: int, device="cuda") -> None:
    """Leaves a NaN-filled block in torch's caching allocator, so an op's next output of that size
    starts as NaN: any element the kernel fails to write shows up in the check."""
    block = torch.empty(nbytes, dtype=torch.uint8, device=device)
    block.view(torch.uint8).fill_(0xFF)  # 0xFFFF is NaN in bf16 and fp16, 0xFFFFFFFF in fp32
    del block


def capture_graph(fn, warmup: int = 1):
    """fn() run ``warmup`` times (once by default) on a side stream (warm-up: plans, workspaces),
    then captured into a CUDA graph. Returns (graph, the outputs of the captured call); replay the
    graph to recompute them."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = fn()
    return graph, outs


def check_weight_cache_over_microbatches(ref, cached, make_input, call, quantize_calls: list, steps: int = 2,
                                         microbatches: int = 2) -> None:
    """Two optimizer steps of two micro-batches each: ``cached`` (an FP8 layer with
    ``cache_quantized_weight=True``, same weights as ``ref``) matches ``ref`` (quantizing per call)
    in outputs and in the accumulated gradients, and quantizes its weight once per step
    (``quantize_calls`` grows by one per step)."""
    for step in range(steps):
        for _ in range(microbatches):
            x = make_input()
            xr, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
            yr, yc = call(ref, xr), call(cached, xc)
            assert snr_db(yc, yr) >= 40.0
            dy = torch.randn_like(yr)
            yr.backward(dy)
            yc.backward(dy)
            assert snr_db(xc.grad, xr.grad) >= 40.0
        assert snr_db(cached.weight.grad, ref.weight.grad) >= 40.0
        assert len(quantize_calls) == step + 1
        with torch.no_grad():  # an optimizer step: the weight changes in place
            for layer in (ref, cached):
                layer.weight -= 0.05 * layer.weight.grad
                for p in layer.parameters():
                    p.grad = None
