"""Exact attention for the vision tower as query-chunked GEMMs, where torch's SDPA is slow.

Qwen2-VL's tower attends over every patch of an image (4,900 for the layout page). torch's
CPU SDPA (its flash kernel) reaches ~165 GFLOP/s in bf16 on an AVX512_BF16 CPU without AMX
(AMD Zen 4), less than half of what the same CPU does in a bf16 GEMM. Here the same
attention is a few large GEMMs (oneDNN/MKL) per block of queries and head:

    S = Q_c · Kᵀ        the block's logits, (rows x patches), in a reused scratch buffer
    P = softmax(S · scale)   in place, computed in fp32 by torch's kernel
    O_c = P · V

The full patches² x heads matrix never exists: the scratch is one head's block, at most
SCRATCH_BYTES (10 MB for 512 rows of 4,900 patches in fp32), so the bound holds for any
image size.

bf16 logits would lose what SDPA keeps: a bf16 GEMM rounds its fp32 sums to 8 bits, and
a logit of 15 then moves by 0.03, a 3 % change of its weight. So in bf16 Q and K are
widened by one column (-m and 1) so the GEMM's fp32 sums give S - m before rounding, m
near each row's maximum: the logits that carry the weight are then small and keep their
accuracy. m is the row's maximum over a probe of the keys (1/8 of them, and the largest),
and a row whose full maximum lies more than SHIFT_SLACK above it is computed again with
that maximum (2026-12-07, evening: the kernel first took every row's exact maximum with
a whole extra GEMM, a third of its time; docs/benchmarks.md).

Which kernel a tower uses is chosen at load time (`choose_kernel`): on an AMX CPU torch's
kernel stays (it runs on AMX tiles, 172 ms a layer); elsewhere both are timed once on the
real shape (two heads of the layout image, in the tower's memory layout) and the faster one
is kept. The chunked kernel reaches transformers through its attention-interface registry,
under ATTENTION_NAME.

The rotary embedding applied to q and k before attention (`rotary_vision`) gives
transformers' bits with fewer passes over memory: 3x faster in fp32, 1.7x in bf16 on Zen 4
(one thread; ~40 ms a layer of the layout image in fp32).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

# The name the chunked kernel is registered under in transformers' ALL_ATTENTION_FUNCTIONS.
# Not "flash..." (transformers would then pass packed sequences) nor "sdpa".
ATTENTION_NAME = "docinbox_query_chunked"
# The patches of the layout image (70 x 70), the shape that dominates a page's vision time.
LAYOUT_PATCHES = 4_900
# The largest logits block held at once (one head, a block of query rows).
SCRATCH_BYTES = 16 * 1024 * 1024
# Query rows per block: measured on Zen 4 (bench/bench_kernels.py vision-attention), 256
# to 512 rows of one head were fastest; fewer rows make more, smaller GEMMs.
CHUNK_ROWS = 512
# bf16 logits are shifted by an estimate of each row's maximum: the maximum over a probe of
# the keys (probe_keys: every PROBE_STRIDE-th one and the PROBE_NORMS of largest norm), at
# 1/8 of a full block's GEMM. A row whose maximum lies more than SHIFT_SLACK above its
# estimate (in scaled logits) is shifted again by its full maximum: within the slack the
# logits that carry the weight are rounded no worse (2^-9 of their weight: bf16's own step,
# which the probabilities are rounded to anyway).
PROBE_STRIDE = 8
PROBE_NORMS = 16
SHIFT_SLACK = 1.0
# The chunked kernel is kept when it is this much faster than SDPA. It was 0.9 ("a near tie
# is not worth leaving torch's own kernel for"), but on Zen 4 the one-head measure read
# 0.86-0.95 from start to start, so most starts kept SDPA, and there the whole layout tower
# took 46.7 s with SDPA against 40.9 s with the chunked kernel (the realistic page,
# docs/benchmarks.md, 2026-12-07): a near tie in the measure is no tie in the tower.
MARGIN = 1.0
# Heads timed by the measure (of the tower's heads, in its memory layout): two heads read
# steadier than one for twice its ~0.3 s of CPU time a kernel.
TIMED_HEADS = 2
# ISA caps change which kernels torch runs: a CPU table cannot know them, so measure.
_ISA_CAP_VARIABLES = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


class VisionConfig(Protocol):
    """What is read and set of a Qwen2-VL vision config (transformers' Qwen2VLVisionConfig)."""

    embed_dim: int
    num_heads: int
    _attn_implementation: str | None  # which attention function the tower's blocks call


class VisionTower(Protocol):
    """A loaded Qwen2-VL vision tower (transformers' Qwen2VisionTransformerPretrainedModel)."""

    @property
    def config(self) -> VisionConfig: ...

    def get_dtype(self) -> torch.dtype: ...


@dataclass(frozen=True)
class AttentionChoice:
    """Which attention kernel the vision tower runs, and why."""

    kernel: str  # "sdpa" (torch's) | "chunked" (this module's)
    reason: str  # "amx" | "measured"
    sdpa_ms: float | None = None  # CPU ms of each over one head of the layout image
    chunked_ms: float | None = None


def chunk_rows(patches: int, itemsize: int, limit: int = CHUNK_ROWS) -> int:
    """Query rows per block: CHUNK_ROWS, fewer where the block would exceed SCRATCH_BYTES."""
    return max(1, min(limit, SCRATCH_BYTES // max(1, patches * itemsize)))


@dataclass
class ShiftCounts:
    """Rows of bf16 logits blocks, and how many of them the probe's estimate left too far
    from their maximum (computed again with the full maximum)."""

    rows: int = 0
    reshifted: int = 0


# Every call's counts, for the benches (a row reshifted costs one row of a GEMM again).
SHIFTS = ShiftCounts()


def probe_keys(key: torch.Tensor, stride: int = PROBE_STRIDE) -> torch.Tensor:
    """(head_dim, probes): the keys a block's row maxima are estimated against: every
    `stride`-th patch (neighbouring patches carry similar keys) and the PROBE_NORMS keys of
    largest norm (a query's largest logit is bounded by its key's norm)."""
    import torch

    strided = key[::stride]
    if key.shape[0] <= stride * PROBE_NORMS:
        return strided.T.contiguous()
    norms = torch.linalg.vector_norm(key.float(), dim=1)
    largest = key[norms.topk(PROBE_NORMS).indices]
    return torch.cat([strided, largest]).T.contiguous()


def query_chunked_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scale: float,
    rows: int | None = None,
) -> torch.Tensor:
    """Non-causal attention of (heads, patches, head_dim) tensors, block of `rows` queries
    at a time; the result as (heads, patches, head_dim), in the inputs' dtype."""
    import torch

    heads, patches, head_dim = query.shape
    rows = rows or chunk_rows(patches, max(4, query.element_size()))
    out = torch.empty(heads, patches, head_dim, dtype=query.dtype)
    scratch = torch.empty(min(rows, patches), patches, dtype=query.dtype)
    shifted = query.dtype != torch.float32
    # In logit units before the scale: how far above zero a shifted row's maximum may lie.
    slack = SHIFT_SLACK / scale
    for head in range(heads):
        q, k, v = query[head], key[head], value[head]
        if shifted:
            # The widened operands: a last column of 1 in K, of -shift per row in Q.
            k_wide = torch.cat([k, torch.ones(patches, 1, dtype=k.dtype)], dim=1).T
            k_probe = probe_keys(k)
            q_wide = torch.empty(min(rows, patches), head_dim + 1, dtype=q.dtype)
        for start in range(0, patches, rows):
            stop = min(patches, start + rows)
            logits = scratch[: stop - start]
            if not shifted:
                torch.mm(q[start:stop], k.T, out=logits)
            else:
                block = q_wide[: stop - start]
                block[:, :head_dim] = q[start:stop]
                torch.amax(torch.mm(q[start:stop], k_probe), dim=1, out=block[:, head_dim])
                block[:, head_dim].neg_()
                torch.mm(block, k_wide, out=logits)
                _reshift_far_rows(block, k_wide, logits, slack)
            logits.mul_(scale)
            # In place (torch computes a bf16 softmax in fp32 internally): the block is
            # not allocated again for the probabilities.
            torch._softmax(logits, -1, False, out=logits)
            torch.mm(logits, v, out=out[head, start:stop])
    return out


def _reshift_far_rows(
    block: torch.Tensor, k_wide: torch.Tensor, logits: torch.Tensor, slack: float
) -> None:
    """Rows whose shifted maximum lies more than `slack` above zero (the probe missed the
    key that sets it) are computed again, shifted by their full maximum: a row's logits
    near its maximum are then as small as if the maximum had been known from the start."""
    import torch

    above = row_maxima_above_zero(logits)
    far = torch.nonzero(above > slack).flatten()
    SHIFTS.rows += logits.shape[0]
    if far.numel():
        SHIFTS.reshifted += far.numel()
        again = block[far]
        again[:, -1] -= above[far]
        logits[far] = torch.mm(again, k_wide)


def row_maxima_above_zero(logits: torch.Tensor) -> torch.Tensor:
    """Each row's maximum where it is above zero; some value <= 0 for a row with none.

    torch's bf16 `amax` over rows is not vectorised: 0.32 ms for a block of 512 x 4,900 on
    Zen 4, 2.7 ms a head of the layout image, against 0.05 ms for the same block read as
    int16 (docs/benchmarks.md, 2026-12-07, night). A positive bf16 value's bits, read as an
    int16, order as the values do, and above every negative value's (sign bit set: a
    negative int16), so the int16 maximum of a row with a positive entry is the bits of
    its largest value. Rows without one (all <= 0) get some value <= 0, which no positive
    slack exceeds. fp32 rows take torch's amax (vectorised)."""
    import torch

    if logits.dtype != torch.bfloat16:
        return torch.amax(logits, dim=1)
    return torch.amax(logits.view(torch.int16), dim=1).view(torch.bfloat16)


def chunked_attention_forward(
    module: torch.nn.Module,  # transformers' attention module (only `training` is read)
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: object,  # the rest of transformers' attention-interface keywords
) -> tuple[torch.Tensor, None]:
    """transformers' attention-interface signature: (1, heads, patches, head_dim) in,
    (1, patches, heads, head_dim) out, as its SDPA function returns it.

    Anything the chunked kernel does not compute (a mask, a batch, dropout, causal, grouped
    key/value heads) goes to transformers' own SDPA function unchanged.
    """
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    plain = (
        attention_mask is None
        and query.shape[0] == 1
        and query.shape[1] == key.shape[1]
        and not kwargs.get("is_causal")
        and not (module.training and dropout)
        and query.dtype in (torch.float32, torch.bfloat16)
    )
    if not plain:
        # Its keywords pass through as transformers sent them, whatever their types.
        sdpa: Callable[..., tuple[torch.Tensor, None]] = sdpa_attention_forward
        return sdpa(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    out = query_chunked_attention(query[0], key[0], value[0], scale)
    return out.transpose(0, 1).unsqueeze(0), None


def _cpu_ms(fn: Callable[[], object]) -> float:
    # The thread's CPU time, not the wall clock: on a shared machine (a NAS, a CI runner)
    # the wall clock counts whatever else ran, and a burst of load would pick the kernel.
    start = time.thread_time()
    fn()
    return (time.thread_time() - start) * 1000


@lru_cache(maxsize=8)
def measure(
    dtype_name: str, heads: int, head_dim: int, patches: int, timed: int = 1, repeat: int = 3
) -> tuple[float, float]:
    """CPU milliseconds of torch's SDPA and of the chunked kernel over `timed` of a tower's
    `heads` heads (in its memory layout: tower_layout), best of `repeat` each, on one thread
    (whose CPU time other processes do not inflate; both kernels split their work across
    threads alike, so the ratio carries over)."""
    import torch
    import torch.nn.functional as F

    generator = torch.Generator().manual_seed(0)
    dtype = getattr(torch, dtype_name)
    q, k, v = (
        t[:timed]
        for t in tower_layout(
            torch.randn(patches, 3, heads, head_dim, generator=generator).to(dtype)
        )
    )
    scale = head_dim**-0.5

    def sdpa() -> object:
        return F.scaled_dot_product_attention(q[None], k[None], v[None], scale=scale)

    def chunked() -> object:
        return query_chunked_attention(q, k, v, scale)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        sdpa(), chunked()  # warm-up: first calls pay for oneDNN's kernel generation
        times = [(_cpu_ms(sdpa), _cpu_ms(chunked)) for _ in range(repeat)]
    finally:
        torch.set_num_threads(threads)
    return min(t[0] for t in times), min(t[1] for t in times)


def tower_layout(qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(heads, patches, head_dim) q, k, v laid out in memory as Qwen2-VL's tower hands them
    to its attention function, from its qkv projection (patches, 3, heads, head_dim): q and k
    fresh from the rotary embedding (patches, heads, head_dim) and transposed, v a strided
    slice of the projection. Kernels are timed on this layout: on Zen 4 torch's SDPA runs
    it 14 % slower than contiguous heads (888 against 782 ms a layer of the layout image),
    the chunked kernel 3 %, so contiguous inputs hid most of the chunked kernel's lead
    (0.93x against 0.84x) and the 0.9 margin picked SDPA in most starts."""
    q, k, v = qkv.permute(1, 0, 2, 3).unbind(0)
    return q.contiguous().transpose(0, 1), k.contiguous().transpose(0, 1), v.transpose(0, 1)


def choose_kernel(
    dtype_name: str, head_dim: int, amx: bool, patches: int = LAYOUT_PATCHES, heads: int = 16
) -> AttentionChoice:
    """The faster attention kernel for a tower of this dtype (and `heads` heads) here.

    On an AMX CPU (and no ISA cap) torch's kernel runs on AMX tiles and is kept without
    measuring. Elsewhere both run over TIMED_HEADS heads of the real image size, once per
    process (~1.2 s of CPU time in bf16 on Zen 4).
    """
    capped = any(name in os.environ for name in _ISA_CAP_VARIABLES)
    if amx and not capped:
        return AttentionChoice("sdpa", "amx")
    sdpa_ms, chunked_ms = measure(
        dtype_name, heads, head_dim, patches, timed=min(heads, TIMED_HEADS)
    )
    kernel = "chunked" if chunked_ms < MARGIN * sdpa_ms else "sdpa"
    return AttentionChoice(kernel, "measured", round(sdpa_ms, 1), round(chunked_ms, 1))


def rotary_vision(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' apply_rotary_pos_emb_vision, the same bits in fewer passes.

    transformers computes q*cos + rotate_half(q)*sin, rotate_half being a negation and a
    concatenation: five full-size temporaries per tensor. Here each half is updated in
    place with its product (a - b is a + (-b) exactly in IEEE arithmetic, so the bits are
    equal; a test holds them equal). In fp32 and in the same fp32 arithmetic for bf16
    inputs, as transformers does; the result in the inputs' dtype.
    """
    cos, sin = cos.unsqueeze(-2).float(), sin.unsqueeze(-2).float()
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    wide = x.float()
    out = wide * cos
    out[..., :half].sub_(wide[..., half:] * sin[..., :half])
    out[..., half:].add_(wide[..., :half] * sin[..., half:])
    return out.to(x.dtype)


def use_one_pass_rotary() -> bool:
    """Have Qwen2-VL's vision attention rotate q and k with `rotary_vision`; whether it does.

    VisionAttention.forward calls its module's apply_rotary_pos_emb_vision by name, so the
    module's name is what changes: for every Qwen2-VL in this process, which is harmless
    because the bits are the same. Left alone if transformers no longer has that function.
    """
    from transformers.models.qwen2_vl import modeling_qwen2_vl

    if not hasattr(modeling_qwen2_vl, "apply_rotary_pos_emb_vision"):
        return False
    modeling_qwen2_vl.apply_rotary_pos_emb_vision = rotary_vision
    return True


def use_fastest_attention(visual: VisionTower) -> AttentionChoice:
    """Give a loaded Qwen2-VL vision tower the faster attention kernel for its dtype here
    (`visual`: the Qwen2VisionTransformerPretrainedModel, already in its final dtype), and
    the one-pass rotary embedding (the same bits)."""
    import torch

    use_one_pass_rotary()

    config = visual.config
    head_dim = config.embed_dim // config.num_heads
    dtype_name = str(visual.get_dtype()).removeprefix("torch.")
    choice = choose_kernel(
        dtype_name, head_dim, amx=torch.cpu._is_amx_tile_supported(), heads=config.num_heads
    )
    log.info("vision attention: %s", choice)
    if choice.kernel == "chunked":
        use_chunked_attention(visual)
    return choice


def use_chunked_attention(visual: VisionTower) -> None:
    """Route a Qwen2-VL vision tower's attention through the chunked kernel.

    VisionAttention asks transformers' attention-interface registry for the function named
    by its config's `_attn_implementation`, once per image (cu_seqlens split): the tower's
    own config names ours, the decoder's keeps SDPA.
    """
    from transformers import AttentionInterface

    # The registry is transformers' own (global) table; registering the same function
    # under the same name again is harmless.
    AttentionInterface.register(ATTENTION_NAME, chunked_attention_forward)
    visual.config._attn_implementation = ATTENTION_NAME
