"""bf16 linears with weights in oneDNN's blocked layout compute what F.linear computes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from daemon.common.cpus import native_bf16
from daemon.engines.mineru.runtimes.int8_linear import KeptHead
from daemon.engines.mineru.runtimes.packed_linear import (
    PackedLinear,
    pack_linears,
    pack_weight,
)

REPO = Path(__file__).resolve().parents[2]

needs_packing = pytest.mark.skipif(
    pack_weight(torch.ones(16, 16, dtype=torch.bfloat16)) is None,
    reason="oneDNN reorders no bf16 weight on this CPU (no AVX512BW/VL/DQ, no AVX-NE-CONVERT)",
)


def _close_to_f_linear(got: torch.Tensor, want: torch.Tensor) -> None:
    # Both are oneDNN GEMMs summing in fp32 and rounding once to bf16: at most the last
    # bit may differ where the sums run in another order (on Zen 4 they are the same bits).
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=1e-3)


@needs_packing
@pytest.mark.parametrize("rows", [1, 3, 8, 40, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_a_packed_linear_computes_f_linear(rows: int, bias: bool) -> None:
    generator = torch.Generator().manual_seed(rows)
    linear = nn.Linear(96, 200, bias=bias).to(torch.bfloat16)
    x = torch.randn(rows, 96, generator=generator).to(torch.bfloat16)
    want = linear(x)
    packed = pack_weight(linear.weight)
    assert packed is not None
    layer = PackedLinear(packed, linear.bias)
    _close_to_f_linear(layer(x), want)
    # Leading dimensions and strided input, as the tower and the head receive them.
    wide = torch.randn(2, rows, 192, generator=generator).to(torch.bfloat16)[..., ::2]
    _close_to_f_linear(layer(wide), linear(wide))
    assert layer.weight.dtype == torch.bfloat16  # what Qwen2-VL's tower asks of fc2


@needs_packing
def test_pack_linears_swaps_the_bf16_linears_only() -> None:
    tower = nn.Sequential(
        nn.Linear(32, 64).to(torch.bfloat16), nn.GELU(), nn.Linear(64, 32), nn.LayerNorm(32)
    )
    x = torch.randn(10, 32).to(torch.bfloat16)
    with torch.no_grad():
        first = tower[0](x)
    assert pack_linears(tower) == 1
    assert type(tower[0]) is PackedLinear and type(tower[2]) is nn.Linear
    with torch.no_grad():
        _close_to_f_linear(tower[0](x), first)
    assert not any(p.dtype == torch.bfloat16 and p.dim() == 2 for p in tower.parameters())


@needs_packing
@pytest.mark.parametrize("rows", [1, 8, 24])
def test_a_packed_head_scores_as_the_plain_one(rows: int) -> None:
    """KeptHead.pack: the bf16 head's logits for an fp32 residual stream, one row (a
    decode step) or many (a verify pass), as the unpacked head gives them."""
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(1000, 64, generator=generator).to(torch.bfloat16)
    head = KeptHead(weight, None)
    states = torch.randn(2, rows, 64, generator=generator)
    want = head(states)
    assert head.pack() and "packed" in repr(head)
    got = head(states)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=2**-7, atol=1e-3)
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_a_head_that_widens_rows_is_not_packed() -> None:
    """Where bf16 is emulated the head widens slices to fp32 (KeptHead): nothing to pack."""
    head = KeptHead(torch.ones(8, 32, dtype=torch.bfloat16), None, widen_rows=True)
    assert not head.pack() and head.packed is None


def test_a_cpu_without_a_bf16_path_keeps_plain_weights() -> None:
    """oneDNN capped to AVX2 refuses to reorder bf16: pack_weight answers
    None (and the loader keeps nn.Linear), it does not raise."""
    code = (
        "import torch\n"
        "from daemon.engines.mineru.runtimes.packed_linear import pack_weight\n"
        "print(pack_weight(torch.ones(64, 64, dtype=torch.bfloat16)) is None)\n"
    )
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True", done.stdout

@pytest.mark.parametrize(
    ("precision", "parts"), [("bf16-int8", "vision+head"), ("bf16", "vision+decoder+head")]
)
def test_the_loader_packs_where_bf16_is_native(
    tiny_model: Path, tmp_path: Path, precision: str, parts: str
) -> None:
    """With native bf16 (and oneDNN's bf16 path) the bf16 tower's linears, a bf16
    decoder's and the head are packed, and the runtime's details say so; elsewhere nothing
    is."""
    from daemon.engines.mineru.runtimes.transformers_model import load_model

    loaded = load_model(str(tiny_model), None, precision, decoder_cache=tmp_path / "c")
    qwen: Any = loaded.model
    visual = qwen.model.visual
    packed = native_bf16() and pack_weight(torch.ones(16, 16, dtype=torch.bfloat16)) is not None
    assert loaded.details["packed_weights"] == (parts if packed else "none")
    for module in (visual, qwen.model.language_model) if precision == "bf16" else (visual,):
        linears = [m for m in module.modules() if isinstance(m, nn.Linear | PackedLinear)]
        assert linears and all(isinstance(m, PackedLinear) == packed for m in linears)
    head = qwen.lm_head
    assert (isinstance(head, PackedLinear) or getattr(head, "packed", None) is not None) == packed
    # The tied embeddings still look tokens up from the plain matrix.
    ids = torch.tensor([[1, 2, 3]])
    assert qwen.model.language_model.embed_tokens(ids).shape[-1] == head.in_features
    assert visual.get_dtype() == torch.bfloat16
    # The packed tower runs: one small image through it.
    grid = torch.tensor([[1, 4, 4]])
    pixels = torch.randn(16, visual.config.in_channels * 2 * 14 * 14).to(torch.bfloat16)
    with torch.no_grad():
        out = visual(pixels, grid_thw=grid)
    features = out.pooler_output if hasattr(out, "pooler_output") else out
    assert torch.isfinite(features.float()).all()

