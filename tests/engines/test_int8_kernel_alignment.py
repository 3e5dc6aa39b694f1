"""torch's int8 kernel (`_weight_int8pack_mm`, torch 2.13) on tensors off its alignment.

The kernel loads its int8 weights and bf16 activations with aligned vector loads and never
checks the addresses: a weight 24 bytes past a 64-byte boundary, as the decoder cache's
safetensors file hands back for the tiny-gguf checkpoint, was a SIGSEGV of the worker on
the first prefill of 4 to 31 tokens after a start that found the cache.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.conftest import REPO

if TYPE_CHECKING:
    import torch

TINY_HF = REPO.parent / "shared" / "models" / "tiny-gguf" / "hf"

# Load twice: the first start quantises and writes the cache, the second reads it back
# (the tensors the kernel crashed on), then runs the speed probe's passes, among them the
# 8-token prefill that died.
CACHED_START = """
import faulthandler, sys
faulthandler.enable()
from daemon.engines.mineru.runtimes.transformers_model import load_model
from daemon.engines.mineru.runtimes import speed_probe
model_dir, cache = sys.argv[1], sys.argv[2]
from pathlib import Path
for start in range(2):
    loaded = load_model(model_dir, None, precision="int8", decoder_cache=Path(cache))
print(speed_probe.time_passes(loaded.model, 8).prefill_tokens)
"""


def test_a_start_from_the_decoder_cache_runs_the_passes_without_crashing(
    tmp_path: Path,
) -> None:
    """In a child process, so a segfault fails this test instead of killing pytest."""
    if not (TINY_HF / "model.safetensors").is_file():
        pytest.skip(f"tiny-gguf HF checkpoint not found at {TINY_HF}")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "2"}
    done = subprocess.run(
        [sys.executable, "-c", CACHED_START, str(TINY_HF), str(tmp_path / "cache")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, (
        f"the int8 decoder started from its cache died with exit {done.returncode} "
        f"(-11 is SIGSEGV):\n{done.stderr[-3000:]}"
    )
    assert done.stdout.strip().splitlines()[-1] == "128"
    assert list((tmp_path / "cache").glob("*.safetensors")), "the second start read no cache"


def offset_copy(tensor: torch.Tensor, offset: int) -> torch.Tensor:
    """A copy of `tensor` whose data starts `offset` bytes past a 64-byte boundary."""
    import torch

    size = tensor.numel() * tensor.element_size()
    buffer = torch.zeros(size + 128, dtype=torch.uint8)
    start = (-buffer.data_ptr()) % 64 + offset
    view = buffer[start : start + size].view(tensor.dtype).view(tensor.shape)
    view.copy_(tensor)
    assert view.data_ptr() % 64 == offset
    return view


@pytest.mark.parametrize(
    ("rows", "out_features", "in_features", "offset"),
    [
        (8, 64, 64, 24),  # the tiny-gguf q_proj of the crash, its cache offset
        (8, 32, 64, 8),  # its k_proj
        (4, 128, 64, 40),  # the smallest block of rows the kernel takes 4 at a time
        (31, 64, 128, 56),  # the most rows the kernel gets (DENSE_ROWS - 1), down_proj
        (1, 896, 896, 24),  # a decode step of the real shape
    ],
)
def test_int8_linear_on_unaligned_tensors_matches_fp32(
    rows: int, out_features: int, in_features: int, offset: int
) -> None:
    """Weights, scales and activations placed off the kernel's alignment (as a file-backed
    tensor or a view can be) give the fp32 product of the dequantised weight."""
    import torch

    from daemon.engines.mineru.runtimes.int8_linear import (
        DENSE_ROWS,
        KERNEL_ALIGNMENT,
        Int8WeightOnlyLinear,
        quantize_rows,
    )

    assert rows < DENSE_ROWS  # the kernel's path, not the dense one
    generator = torch.Generator().manual_seed(rows * out_features + offset)
    weight = torch.randn(out_features, in_features, generator=generator) * 0.05
    q, scales = quantize_rows(weight, torch.bfloat16)
    bias = torch.randn(out_features, generator=generator)
    layer = Int8WeightOnlyLinear(
        offset_copy(q, offset),
        offset_copy(scales, offset),
        bias,
        torch.float32,
    )
    # Checked before a call: without the copy the call below is a segfault, not a failure.
    assert layer.weight_int8.data_ptr() % KERNEL_ALIGNMENT == 0
    assert layer.scales.data_ptr() % KERNEL_ALIGNMENT == 0
    assert layer.use_kernel

    x = torch.randn(rows, in_features, generator=generator).to(torch.bfloat16)
    got = layer(offset_copy(x, 16)).float()

    reference = x.float() @ (q.float() * scales.float()[:, None]).T + bias
    # bf16 activations into the kernel and a bf16 result: relative error ~2^-8 per value.
    tolerance = 1e-2 * reference.abs().amax().item()
    assert (got - reference).abs().amax().item() <= tolerance
