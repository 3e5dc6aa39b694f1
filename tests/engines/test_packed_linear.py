"""bf16 linears with weights in oneDNN's blocked layout compute what F.linear computes."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from daemon.common.cpus import native_bf16
from daemon.engines.mineru.runtimes.int8_linear import KeptHead
from daemon.engines.mineru.runtimes.packed_linear import (
    FusedPart,
    PackedLinear,
    fuse_decoder_projections,
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


class _Attention(nn.Module):
    def __init__(self, width: int, kv: int) -> None:
        super().__init__()
        self.q_proj = nn.Linear(width, width).to(torch.bfloat16)
        self.k_proj = nn.Linear(width, kv).to(torch.bfloat16)
        self.v_proj = nn.Linear(width, kv).to(torch.bfloat16)
        self.o_proj = nn.Linear(width, width, bias=False).to(torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # transformers' Qwen2 attention calls its projections so (the attention left out).
        q: torch.Tensor = self.q_proj(x)
        k: torch.Tensor = self.k_proj(x)
        v: torch.Tensor = self.v_proj(x)
        out: torch.Tensor = self.o_proj(q * k.repeat(1, 1, q.shape[-1] // k.shape[-1]).tanh())
        return out + v.sum()


class _Mlp(nn.Module):
    def __init__(self, width: int, inner: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(width, inner, bias=False).to(torch.bfloat16)
        self.up_proj = nn.Linear(width, inner, bias=False).to(torch.bfloat16)
        self.down_proj = nn.Linear(inner, width, bias=False).to(torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return out


class _Layer(nn.Module):
    def __init__(self, width: int = 128, kv: int = 32, inner: int = 320) -> None:
        super().__init__()
        self.self_attn = _Attention(width, kv)
        self.mlp = _Mlp(width, inner)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.mlp(self.self_attn(x))
        return out


@needs_packing
@pytest.mark.parametrize("rows", [1, 3, 12, 300])
def test_fused_projections_compute_the_separate_packed_linears(rows: int) -> None:
    """q/k/v as one packed GEMM and gate/up as one give each linear what its own packed
    GEMM gives: every output element is the same fp32 sum over the same row (the same bits
    on Zen 4; the last bit at most where a kernel sums in another order)."""
    generator = torch.Generator().manual_seed(rows)
    separate = [_Layer(), _Layer()]
    fused = copy.deepcopy(separate)
    assert sum(pack_linears(layer) for layer in separate) == 2 * 7
    assert sum(fuse_decoder_projections(layer) for layer in fused) == 2 * 2
    assert sum(pack_linears(layer) for layer in fused) == 2 * 2  # o_proj, down_proj: single
    x = torch.randn(2, rows, 128, generator=generator).to(torch.bfloat16)
    with torch.no_grad():
        for layer_s, layer_f in zip(separate, fused, strict=True):
            want = [getattr(layer_s.self_attn, n)(x) for n in ("q_proj", "k_proj", "v_proj")]
            got = [getattr(layer_f.self_attn, n)(x) for n in ("q_proj", "k_proj", "v_proj")]
            for g, w in zip(got, want, strict=True):
                _close_to_f_linear(g, w)
            _close_to_f_linear(layer_f(x), layer_s(x))
    assert "part 1 of 3" in repr(fused[0].self_attn.k_proj)
    assert fused[0].mlp.up_proj.weight.dtype == torch.bfloat16


@needs_packing
def test_a_fused_projection_called_out_of_turn_raises() -> None:
    """A later part holds no weight: called on another input than its group's first part
    just had (a transformers that calls them otherwise) it says so instead of answering
    with another input's output."""
    layer = _Layer()
    assert fuse_decoder_projections(layer) == 2
    x, y = (torch.randn(1, 4, 128).to(torch.bfloat16) for _ in range(2))
    with torch.no_grad():
        layer.self_attn.q_proj(x)
        with pytest.raises(RuntimeError, match="fused projection"):
            layer.self_attn.k_proj(y)
        with pytest.raises(RuntimeError, match="fused projection"):
            layer.mlp.up_proj(x)  # before gate_proj
        layer.mlp.gate_proj(x)
        layer.mlp.up_proj(x)
        with pytest.raises(RuntimeError, match="fused projection"):
            layer.mlp.up_proj(x)  # twice: the group let its outputs go after the last part


def test_fusing_leaves_fp32_and_partial_groups_alone() -> None:
    """Only a whole group of bf16 nn.Linears is fused: an fp32 layer (the fp32 and int8
    precisions' decoders) and a layer whose projections are no longer plain stay as
    they are."""
    fp32 = _Layer().float()
    assert fuse_decoder_projections(fp32) == 0
    assert type(fp32.self_attn.q_proj) is nn.Linear
    partial = _Layer()
    partial.mlp.up_proj = nn.Identity()  # type: ignore[assignment]
    packs = pack_weight(torch.ones(16, 16, dtype=torch.bfloat16)) is not None
    assert fuse_decoder_projections(partial) == int(packs)  # the attention's group only
    assert type(partial.mlp.gate_proj) is nn.Linear


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
        kinds = nn.Linear | PackedLinear | FusedPart
        linears = [m for m in module.modules() if isinstance(m, kinds)]
        assert linears and all(isinstance(m, PackedLinear | FusedPart) == packed for m in linears)
    if precision == "bf16" and packed:  # a decoder layer's q/k/v and gate/up: one GEMM each
        layer = qwen.model.language_model.layers[0]
        assert all(
            isinstance(getattr(owner, name), FusedPart)
            for owner, names in ((layer.self_attn, "qkv"), (layer.mlp, ("gate", "up")))
            for name in (f"{n}_proj" for n in names)
        )
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

