"""The vision tower's query-chunked attention: exact in fp32, and in bf16 no further from the
fp32 tower than torch's own bf16 SDPA moves it (twice that at most).

Tiny random shapes (head dim 80, as MinerU2.5's tower), seconds in all. The figures the
bounds rest on, measured here (AMD EPYC, AVX512_BF16): one attention call of soft
(sharpness 1) and sharp (3) random logits against the fp32 result, max |error|: SDPA
0.00095 / 0.0078, chunked 0.0014 / 0.0126 (1.4x / 1.6x; relative RMS 2.0x / 1.6x). The
tower's output (two blocks, two images) against the fp32 tower, relative RMS: SDPA 0.0044,
chunked 0.0044 (1.00x); with qkv weights x8 (sharper attention) 0.0114 and 0.0116 (1.02x):
the bf16 linears move the tower far more than the attention kernel does.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

from daemon.engines.mineru.runtimes import vision_attention
from daemon.engines.mineru.runtimes.decoder_attention import ATTENTION_NAME as DECODER_ATTENTION
from daemon.engines.mineru.runtimes.vision_attention import (
    ATTENTION_NAME,
    MARGIN,
    PROBE_NORMS,
    SCRATCH_BYTES,
    SHIFTS,
    choose_kernel,
    chunk_rows,
    chunked_attention_forward,
    probe_keys,
    query_chunked_attention,
    row_maxima_above_zero,
    tower_layout,
    use_chunked_attention,
    use_one_pass_rotary,
)

HEAD_DIM = 80
# Two images in one call (cu_seqlens): 256 and 96 patches.
GRID = ((1, 16, 16), (1, 8, 12))


def qkv(heads: int, patches: int, sharpness: float, seed: int = 0) -> tuple[Any, Any, Any]:
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(heads, patches, HEAD_DIM, generator=generator) for _ in range(3))
    return q * sharpness, k, v


def sdpa(q: Any, k: Any, v: Any) -> Any:
    return torch.nn.functional.scaled_dot_product_attention(q[None], k[None], v[None])[0]


@pytest.mark.parametrize("rows", [None, 64, 100, 1_000])
def test_fp32_is_sdpa_within_1e_5_whatever_the_block_size(rows: int | None) -> None:
    q, k, v = qkv(3, 700, sharpness=3.0)
    got = query_chunked_attention(q, k, v, HEAD_DIM**-0.5, rows=rows)
    assert got.dtype == torch.float32 and got.shape == q.shape
    assert (got - sdpa(q, k, v)).abs().max().item() < 1e-5


@pytest.mark.parametrize("sharpness", [1.0, 3.0])
def test_bf16_moves_one_call_at_most_twice_what_bf16_sdpa_does(sharpness: float) -> None:
    q, k, v = (t.bfloat16() for t in qkv(4, 1_500, sharpness))
    exact = sdpa(q.float(), k.float(), v.float())
    sdpa_error = (sdpa(q, k, v).float() - exact).abs().max().item()
    got = query_chunked_attention(q, k, v, HEAD_DIM**-0.5)
    assert got.dtype == torch.bfloat16
    assert (got.float() - exact).abs().max().item() <= 2 * sdpa_error


def test_rows_whose_maximum_the_probe_misses_are_shifted_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """bf16 logits are shifted by each row's maximum over a probe of the keys. Here every
    query's weight lies on seven keys the probe does not hold (not every 8th, not the
    largest norms): each row is shifted again by its full maximum and stays within twice
    bf16 SDPA's error; without that second shift it would be ~9x SDPA's."""
    generator = torch.Generator().manual_seed(3)
    patches = 1_500
    k = torch.randn(patches, HEAD_DIM, generator=generator)
    k[100:140] *= 1.6  # the largest norms, in random directions
    u = torch.randn(HEAD_DIM, generator=generator)
    u /= u.norm()
    k[1:8] = u * 9.5 + 0.3 * torch.randn(7, HEAD_DIM, generator=generator)
    q = torch.randn(patches, HEAD_DIM, generator=generator) * 0.5 + u * 12.0
    v = torch.randn(patches, HEAD_DIM, generator=generator)
    q, k, v = (t[None].bfloat16() for t in (q, k, v))
    exact = sdpa(q.float(), k.float(), v.float())
    sdpa_error = (sdpa(q, k, v).float() - exact).abs().max().item()

    def error() -> tuple[float, int]:
        SHIFTS.rows = SHIFTS.reshifted = 0
        got = query_chunked_attention(q, k, v, HEAD_DIM**-0.5)
        return (got.float() - exact).abs().max().item(), SHIFTS.reshifted

    shifted_again, reshifted = error()
    assert reshifted == patches and shifted_again <= 2 * sdpa_error
    monkeypatch.setattr(vision_attention, "SHIFT_SLACK", float("inf"))
    unshifted, reshifted = error()
    assert reshifted == 0 and unshifted > 4 * sdpa_error


def test_row_maxima_read_as_int16_are_the_positive_maxima() -> None:
    """The reshift check reads bf16 logits as int16: every row with a positive entry gets
    its exact maximum; a row with none gets a value no positive slack exceeds (all-negative
    rows, zeros of both signs, the smallest subnormal, infinities)."""
    generator = torch.Generator().manual_seed(5)
    logits = (torch.randn(64, 300, generator=generator) * 8).bfloat16()
    logits[:8] = -logits[:8].abs()  # no positive entry
    logits[8, :] = -0.0
    logits[9, :] = 0.0
    logits[10, 7] = float("inf")
    logits[11, 3] = float("-inf")
    logits[12] = -logits[12].abs()
    logits[12, 5] = torch.finfo(torch.bfloat16).smallest_normal / 4  # a subnormal
    got = row_maxima_above_zero(logits)
    exact = torch.amax(logits, dim=1)
    positive = exact > 0
    assert int(positive.sum()) == 64 - 10  # rows 0-7 (negative), 8 and 9 (zeros)
    assert torch.equal(got[positive], exact[positive])
    assert bool((got[~positive] <= 0).all())
    assert torch.equal(row_maxima_above_zero(logits.float()), exact.float())


def test_the_probe_holds_every_eighth_key_and_the_largest() -> None:
    generator = torch.Generator().manual_seed(4)
    k = torch.randn(1_000, HEAD_DIM, generator=generator)
    k[501] *= 10  # the largest norm, off the stride
    probe = probe_keys(k)
    assert probe.shape == (HEAD_DIM, 125 + PROBE_NORMS)
    assert torch.equal(probe[:, :125], k[::8].T) and any(
        torch.equal(probe[:, i], k[501]) for i in range(125, probe.shape[1])
    )
    assert torch.equal(probe_keys(k[:40]), k[:40:8].T)  # a small image: the stride alone


def test_the_logits_block_is_bounded_on_the_layout_image() -> None:
    """One head's block of query rows at a time: the 4,900 x 4,900 x 16 matrix (1.5 GB in
    fp32) never exists, and the block stays under SCRATCH_BYTES (<= 64 MB)."""
    for patches in (4_900, 40_000):
        rows = chunk_rows(patches, 4)
        assert rows * patches * 4 <= SCRATCH_BYTES <= 64 * 2**20
    assert chunk_rows(4_900, 4) >= 256  # blocks large enough to run at GEMM speed


def tower(sharpen: float = 1.0) -> Any:
    from transformers import Qwen2VLVisionConfig
    from transformers.models.qwen2_vl.modeling_qwen2_vl import (
        Qwen2VisionTransformerPretrainedModel,
    )

    config = Qwen2VLVisionConfig(depth=2, embed_dim=2 * HEAD_DIM, hidden_size=64, num_heads=2,
                                 mlp_ratio=2)  # fmt: skip
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model: Any = Qwen2VisionTransformerPretrainedModel(config)
    model.eval()
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight.mul_(sharpen)
    return model


def features(model: Any, dtype: Any) -> Any:
    grid = torch.tensor(GRID)
    patches = int(grid.prod(-1).sum())
    pixels = torch.randn(patches, 3 * 2 * 14 * 14, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        out = copy.deepcopy(model).to(dtype)(pixels.to(dtype), grid_thw=grid)
    return out.last_hidden_state.float()


def chunked(model: Any) -> Any:
    model = copy.deepcopy(model)
    use_chunked_attention(model)
    assert model.config._attn_implementation == ATTENTION_NAME
    return model


def test_an_fp32_tower_over_two_images_is_sdpas_within_1e_5() -> None:
    reference = tower()
    want = features(reference, torch.float32)
    got = features(chunked(reference), torch.float32)
    assert (got - want).abs().max().item() < 1e-5 * max(1.0, want.abs().max().item())


@pytest.mark.parametrize("sharpen", [1.0, 8.0])
def test_a_bf16_tower_moves_at_most_twice_what_bf16_sdpa_moves_it(sharpen: float) -> None:
    reference = tower(sharpen)
    exact = features(reference, torch.float32)

    def moved(model: Any) -> float:
        error = features(model, torch.bfloat16) - exact
        return float(error.pow(2).mean().sqrt() / exact.pow(2).mean().sqrt())

    bf16_sdpa = moved(reference)
    assert 0 < moved(chunked(reference)) <= 2 * bf16_sdpa


def test_what_the_chunked_kernel_does_not_compute_goes_to_sdpa() -> None:
    """A mask (or a batch, causal, dropout) is transformers' SDPA function's business."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    module = torch.nn.Module().eval()
    module.is_causal = False  # type: ignore[assignment]
    q, k, v = (t[None] for t in qkv(2, 50, 1.0))
    mask = torch.zeros(1, 1, 50, 50)
    mask[..., 40:] = float("-inf")
    want, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.1)
    got, _ = chunked_attention_forward(module, q, k, v, mask, scaling=0.1)
    assert torch.equal(got, want)
    plain, _ = chunked_attention_forward(module, q, k, v, None, scaling=0.1)
    unmasked, _ = sdpa_attention_forward(module, q, k, v, None, scaling=0.1)
    assert plain.shape == unmasked.shape == (1, 50, 2, HEAD_DIM)
    assert (plain - unmasked).abs().max().item() < 1e-5


def test_amx_keeps_torchs_kernel_unless_an_isa_cap_is_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS"):
        monkeypatch.delenv(name, raising=False)
    choice = choose_kernel("bfloat16", HEAD_DIM, amx=True)
    assert (choice.kernel, choice.reason, choice.sdpa_ms) == ("sdpa", "amx", None)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
    capped = choose_kernel("bfloat16", 16, amx=True, patches=300)
    assert capped.reason == "measured" and capped.sdpa_ms and capped.chunked_ms
    faster = capped.chunked_ms < MARGIN * capped.sdpa_ms
    assert capped.kernel == ("chunked" if faster else "sdpa")


def test_the_kernels_are_timed_on_the_layout_the_tower_hands_them() -> None:
    """choose_kernel times q, k and v laid out in memory as the tower's attention function
    gets them (on Zen 4 SDPA ran 14 % slower on that layout than on contiguous heads, which
    decided the choice): tower_layout has the strides a real tower passes."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    strides: list[tuple[tuple[int, ...], ...]] = []
    shapes: list[tuple[int, int, int]] = []

    def spy(module: Any, query: Any, key: Any, value: Any, attention_mask: Any = None,
            **kwargs: Any) -> Any:  # fmt: skip
        strides.append(tuple(t[0].stride() for t in (query, key, value)))
        shapes.append(tuple(query[0].shape))
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("docinbox_test_spy", spy)
    model = tower()
    model.config._attn_implementation = "docinbox_test_spy"
    use_one_pass_rotary()  # as the loader runs the tower
    features(model, torch.float32)
    heads, patches, head_dim = shapes[0]
    layout = tower_layout(torch.randn(patches, 3, heads, head_dim))
    assert strides[0] == tuple(t.stride() for t in layout)
    assert all(t.shape == (heads, patches, head_dim) for t in layout)


def test_the_loader_names_the_kernel_its_tower_runs(tiny_model: Path) -> None:
    """load_model times both kernels for the tower's dtype and head size, keeps the faster,
    and says which; the decoder keeps its own (grouped SDPA, decoder_attention.py), never
    the tower's kernel."""
    from daemon.engines.mineru.runtimes.transformers_model import load_model

    loaded = load_model(str(tiny_model), None, precision="bf16")
    kernel = loaded.details["vision_attention"]
    assert kernel in ("sdpa", "chunked")
    visual = loaded.model.model.visual
    assert (visual.config._attn_implementation == ATTENTION_NAME) == (kernel == "chunked")
    decoder = loaded.model.model.language_model.config._attn_implementation
    assert decoder == DECODER_ATTENTION and loaded.details["decoder_attention"] == "grouped"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_one_pass_rotary_gives_transformers_bits(dtype: Any) -> None:
    from transformers.models.qwen2_vl import modeling_qwen2_vl

    from daemon.engines.mineru.runtimes.vision_attention import rotary_vision

    rotate_half: Any = modeling_qwen2_vl.rotate_half  # untyped in transformers

    generator = torch.Generator().manual_seed(2)
    q, k, _ = torch.randn(300, 3, 4, HEAD_DIM, generator=generator).to(dtype).unbind(1)
    cos, sin = torch.randn(2, 300, HEAD_DIM, generator=generator)
    got = rotary_vision(q, k, cos, sin)
    # transformers' apply_rotary_pos_emb_vision (5.25), spelled out: the name itself is
    # swapped for rotary_vision once a model is loaded in this process.
    c, s = cos.unsqueeze(-2).float(), sin.unsqueeze(-2).float()
    for x, rotated in zip((q, k), got, strict=True):
        want = (x.float() * c + rotate_half(x.float()) * s).to(dtype)
        assert rotated.dtype == dtype and torch.equal(rotated, want)


def test_a_tower_with_the_one_pass_rotary_gives_the_same_bits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from transformers.models.qwen2_vl import modeling_qwen2_vl

    from daemon.engines.mineru.runtimes.vision_attention import rotary_vision

    def transformers_rotary(q: Any, k: Any, cos: Any, sin: Any) -> tuple[Any, Any]:
        c, s = cos.unsqueeze(-2).float(), sin.unsqueeze(-2).float()
        turn: Any = modeling_qwen2_vl.rotate_half  # untyped in transformers
        return tuple((x.float() * c + turn(x.float()) * s).to(x.dtype) for x in (q, k))

    model = tower()
    monkeypatch.setattr(modeling_qwen2_vl, "apply_rotary_pos_emb_vision", transformers_rotary)
    want = features(model, torch.float32)
    monkeypatch.setattr(modeling_qwen2_vl, "apply_rotary_pos_emb_vision", rotary_vision)
    assert torch.equal(features(model, torch.float32), want)
