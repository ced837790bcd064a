"""Host-side behaviour of turbo.ops.rmsnorm that needs no GPU: argument errors raised before any
launch (in Python and in the core), and shapes through fake/meta tensors and torch.compile."""


import pytest
import torch

import primus_turbo.pytorch as turbo
from primus_turbo._core import check, lib

from host_check_utils import FAKE_PTR, desc, meta


@pytest.mark.parametrize("shape", [(5, 16), (2, 3, 16), (16,), (0, 16), (2, 0, 7)])
def test_shapes_forward_and_backward_on_meta(shape):
    x = meta(*shape, grad=True)
    gamma = meta(shape[-1], grad=True)
    y = turbo.ops.rmsnorm(x, gamma)
    assert y.shape == x.shape and y.dtype == x.dtype
    y.sum().backward()
    assert x.grad.shape == x.shape and gamma.grad.shape == gamma.shape


def test_float32_gamma_keeps_its_dtype():
    x, gamma = meta(4, 8, grad=True), meta(8, dtype=torch.float32, grad=True)
    y = turbo.ops.rmsnorm(x, gamma)
    assert y.dtype == torch.bfloat16
    y.sum().backward()
    assert gamma.grad.dtype == torch.float32


def test_fake_ops_shapes():
    y, rstd = torch.ops.primus_turbo.rmsnorm_fwd(meta(6, 32), meta(32), 1e-6, False)
    assert y.shape == (6, 32) and rstd.shape == (6,) and rstd.dtype == torch.float32
    dx, dgamma = torch.ops.primus_turbo.rmsnorm_bwd(meta(6, 32), meta(6, 32), meta(32), rstd, True)
    assert dx.shape == (6, 32) and dgamma.shape == (32,)


def test_fake_tensor_mode_on_cuda_device():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(3, 5, 64, device="cuda", dtype=torch.float16)
        y = turbo.ops.rmsnorm(x, torch.empty(64, device="cuda", dtype=torch.float16), zero_centered=True)
    assert y.shape == (3, 5, 64) and y.device.type == "cuda"


def test_torch_compile_traces_without_graph_break():
    def fn(x, g):
        return turbo.ops.rmsnorm(x, g) * 2 + 1

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    x, g = meta(8, 4, 32, grad=True), meta(32, grad=True)
    out = compiled(x, g)
    assert out.shape == (8, 4, 32)
    out.sum().backward()
    assert x.grad.shape == x.shape and g.grad.shape == g.shape


def test_module_on_meta():
    m = turbo.modules.RMSNorm((4, 8), zero_centered_gamma=True, device="meta", dtype=torch.bfloat16)
    assert m.weight.shape == (4, 8)
    assert m(meta(2, 4, 8)).shape == (2, 4, 8)
    assert turbo.modules.RMSNorm(8, elementwise_affine=False).weight is None
    with pytest.raises(ValueError, match="does not end with normalized_shape"):
        m(meta(2, 8, 4))


def test_registered_as_custom_ops():
    assert "primus_turbo::rmsnorm_fwd(Tensor x, Tensor gamma, float eps, bool zero_centered)" in str(
        torch.ops.primus_turbo.rmsnorm_fwd.default._schema
    )
    assert "primus_turbo::rmsnorm_bwd(Tensor dy, Tensor x, Tensor gamma, Tensor rstd" in str(
        torch.ops.primus_turbo.rmsnorm_bwd.default._schema
    )


@pytest.mark.parametrize(
    "x,gamma,kwargs,exc,match",
    [
        (torch.randn(4, 8), torch.randn(8), {}, ValueError, "argument 'x' is on cpu; expected a CUDA device"),
        ([1.0], meta(8), {}, TypeError, "argument 'x' must be a torch.Tensor"),
        (meta(4, 8, dtype=torch.int32), meta(8), {}, TypeError, "argument 'x' has dtype torch.int32"),
        (meta(4, 8), meta(8, dtype=torch.float16), {}, TypeError, "argument 'gamma' has dtype torch.float16"),
        (meta(), meta(1), {}, ValueError, "argument 'x' must have at least 1 dimension"),
        (meta(4, 0), meta(0), {}, ValueError, "its last dimension must be 1 to 65536"),
        (meta(2, 65537), meta(65537), {}, ValueError, "its last dimension must be 1 to 65536"),
        (meta(4, 8), meta(7), {}, ValueError, r"argument 'gamma' has shape \(7,\); expected \[8\]"),
        (meta(4, 8), meta(2, 4), {}, ValueError, "argument 'gamma' has shape"),
        (meta(4, 8), meta(8), {"eps": -1.0}, ValueError, "argument 'eps' must be a finite non-negative number"),
        (meta(4, 8), meta(8), {"eps": float("nan")}, ValueError, "argument 'eps'"),
    ],
)
def test_bad_arguments(x, gamma, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        turbo.ops.rmsnorm(x, gamma, **kwargs)


# ---- the core's own checks (what a C++ or JAX caller sees); they run before any device work ----


def fwd(x, gamma, y, rstd, eps=1e-6):
    return lib.pt_rmsnorm_fwd(x, gamma, y, rstd, eps, 0, None)


@pytest.mark.parametrize(
    "args,match",
    [
        ((desc([4, 8], strides=[16, 1]), desc([8]), desc([4, 8]), desc([4], 0)), "argument 'x' .* must be contiguous"),
        ((desc([4, 8]), desc([8], 1), desc([4, 8]), desc([4], 0)), "argument 'gamma' has dtype float16"),
        ((desc([4, 8]), desc([8]), desc([4, 8], 0), desc([4], 0)), "argument 'y' has dtype float32"),
        ((desc([4, 8]), desc([8]), desc([8, 4]), desc([4], 0)), "argument 'y' has shape \\[8, 4\\]"),
        ((desc([4, 8]), desc([8]), desc([4, 8]), desc([5], 0)), "argument 'rstd' .* expected 4 elements"),
        ((desc([4, 8]), desc([8]), desc([4, 8]), desc([4], 2)), "argument 'rstd' has dtype bfloat16"),
        ((desc([4, 8], ptr=FAKE_PTR + 1), desc([8]), desc([4, 8]), desc([4], 0)), "'x' is not aligned"),
        ((desc([4, 8], dtype=7), desc([8]), desc([4, 8]), desc([4], 0)), "argument 'x' has dtype int32"),
    ],
)
def test_core_rejects_bad_descriptors(args, match):
    with pytest.raises(ValueError, match=match):
        check(fwd(*args))


def test_core_rejects_bad_eps_and_huge_hidden():
    with pytest.raises(ValueError, match="argument 'eps'"):
        check(fwd(desc([4, 8]), desc([8]), desc([4, 8]), desc([4], 0), eps=-1.0))
    from primus_turbo._core.lib import TurboNotSupportedError

    with pytest.raises(TurboNotSupportedError, match="up to 65536"):
        check(fwd(desc([1, 65540]), desc([65540]), desc([1, 65540]), desc([1], 0)))


def test_core_forward_with_no_rows_is_a_no_op():
    check(fwd(desc([0, 8], ptr=None), desc([8]), desc([0, 8], ptr=None), desc([0], 0, ptr=None)))


def test_core_backward_checks_the_workspace():
    x, g = desc([64, 4096]), desc([4096])
    need = lib.pt_rmsnorm_bwd_workspace_bytes(64, 4096)
    assert need == 64 * 4096 * 4  # one partial row per block, one block per row here
    status = lib.pt_rmsnorm_bwd(x, x, g, desc([64], 0), x, g, FAKE_PTR, need - 1, 0, None)
    with pytest.raises(ValueError, match="argument 'workspace' has"):
        check(status)
    assert lib.pt_rmsnorm_bwd_workspace_bytes(0, 4096) == 0


def test_workspace_stays_bounded():
    for rows, hidden in [(1 << 20, 128), (1 << 20, 1024), (1 << 20, 4096), (1 << 20, 65536)]:
        assert lib.pt_rmsnorm_bwd_workspace_bytes(rows, hidden) <= 36 << 20


def test_prepare_rejects_bad_arguments():
    with pytest.raises(ValueError, match="argument 'dtype'"):
        check(lib.pt_rmsnorm_prepare(7, 7, 128))
    with pytest.raises(ValueError, match="argument 'gamma_dtype'"):
        check(lib.pt_rmsnorm_prepare(2, 1, 128))
    with pytest.raises(ValueError, match="argument 'hidden'"):
        check(lib.pt_rmsnorm_prepare(2, 2, 0))
