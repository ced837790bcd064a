"""The examples page of the original library runs verbatim (each file is copied unchanged)."""

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parent / "seed_examples"


@pytest.mark.gpu
@pytest.mark.parametrize(
    "script,expected",
    [
        ("example_1_1_gemm.py", "torch.Size([128, 256])"),
        ("example_1_2_attention.py", "torch.Size([4, 4096, 32, 128])"),
        ("example_1_3_grouped_gemm.py", "torch.Size([128, 256])"),
        ("example_2_1_linear.py", "torch.Size([128, 256])"),
        ("example_3_2_gemm_fp8.py", "torch.Size([128, 256])"),
        ("example_3_4_gemm_fp4.py", "torch.Size([128, 256])"),
        ("example_5_1_backend_selection.py", "torch.Size([128, 256])"),
        ("example_3_3_grouped_gemm_fp8.py", "torch.Size([128, 256])"),
        ("example_5_2_autotune.py", "torch.Size([128, 256])"),
    ],
)
def test_seed_example_runs_verbatim(script, expected):
    result = subprocess.run([sys.executable, str(EXAMPLES / script)], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    assert expected in result.stdout
