"""turbo.modules.Linear against torch.nn.Linear and a float64 reference."""

import pytest
import torch

import primus_turbo.pytorch as turbo
from turbo_test_utils import assert_gate

pytestmark = pytest.mark.gpu


def _pair(in_f, out_f, bias, dtype):
    ours = turbo.modules.Linear(in_f, out_f, bias=bias, device="cuda", dtype=dtype)
    ref = torch.nn.Linear(in_f, out_f, bias=bias, device="cuda", dtype=torch.float64)
    with torch.no_grad():
        ref.weight.copy_(ours.weight)
        if bias:
            ref.bias.copy_(ours.bias)
    return ours, ref


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_linear_matches_float64_forward_and_backward(dtype, bias):
    torch.manual_seed(0)
    ours, ref = _pair(512, 384, bias, dtype)
    x = torch.randn(4, 33, 512, device="cuda", dtype=dtype, requires_grad=True)
    x64 = x.detach().double().requires_grad_()
    y = ours(x)
    y_ref = ref(x64)
    assert y.shape == (4, 33, 384)
    assert_gate(y, y_ref, dtype)
    g = torch.randn_like(y)
    y.backward(g)
    y_ref.backward(g.double())
    assert_gate(x.grad, x64.grad, dtype, "grad_x")
    assert_gate(ours.weight.grad, ref.weight.grad, dtype, "grad_weight")
    if bias:
        assert_gate(ours.bias.grad, ref.bias.grad, dtype, "grad_bias")


def test_linear_same_parameters_as_torch():
    ours = turbo.modules.Linear(64, 32, device="cuda", dtype=torch.bfloat16)
    assert ours.weight.shape == (32, 64) and ours.bias.shape == (32,)
    assert "in_features=64, out_features=32, bias=True" in repr(ours)


def test_linear_torch_compile_max_autotune():
    torch.manual_seed(1)
    ours, ref = _pair(256, 128, True, torch.bfloat16)
    compiled = torch.compile(ours, fullgraph=True, mode="max-autotune")
    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):  # cudagraph-trees record on a later call: run past it
        y = compiled(x)
    assert_gate(y, ref(x.double()), torch.bfloat16)
