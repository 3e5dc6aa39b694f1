"""bf16 linears whose weights are laid out once, at load, in oneDNN's own blocked format.

`F.linear` on a bf16 weight hands oneDNN the plain [out, in] matrix on every call, and a
call pays for arranging it into the layout oneDNN's kernels read. Over a few rows that is
most of the call: the decoder's head (151,936 x 896, 272 MB) took 21-23 ms for one row on
Zen 4 (12.8 GB/s, where one core streams 27 GB/s) and 26 ms for 8, against 11.5-14 ms and
11.6 ms with the weight reordered once (`torch.ops.mkldnn._reorder_linear_weight`, what
torch's own compiler does for frozen bf16 weights); the vision tower's linears over
thousands of patches gain 5-10 % (docs/benchmarks.md, 2026-12-07, evening). The output is
oneDNN's fp32-accumulated GEMM either way: on Zen 4 the same bits (a test holds them to
F.linear's within bf16 rounding on any CPU).

Used only where torch computes bf16 natively (AVX512_BF16 or AMX, not capped): below that
oneDNN refuses to reorder bf16 (torch 2.13: "bf16 path needs the cpu support
avx_ne_convert or avx512bw, avx512vl and avx512dq") or emulates it.

Imports torch at module level: only the worker's model loader and the benches import it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

log = logging.getLogger(__name__)


def pack_weight(weight: torch.Tensor, rows_hint: int = 1) -> torch.Tensor | None:
    """`weight` (bf16, [out, in]) in oneDNN's blocked layout, or None where oneDNN will
    not take it here (its reason is logged). `rows_hint`: the rows a call usually has;
    measured on Zen 4 it changes neither the bits nor the speed by more than noise."""
    if weight.dtype != torch.bfloat16 or weight.dim() != 2:
        return None
    try:
        packed: torch.Tensor = torch.ops.mkldnn._reorder_linear_weight(
            weight.detach().contiguous(), rows_hint
        )
    except (RuntimeError, AttributeError) as exc:  # no oneDNN, or no bf16 path on this CPU
        log.info("bf16 weights stay unpacked: %s", exc)
        return None
    return packed


def packed_linear(
    rows: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """`F.linear(rows, weight, bias)` on a weight from pack_weight: rows 2-D, bf16."""
    out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
        rows.contiguous(), packed, bias, "none", [], ""
    )
    return out


def packed_forward(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for any leading dimensions, in and out in x's dtype."""
    rows = x.reshape(-1, int(packed.shape[1])).to(packed.dtype)
    y = packed_linear(rows, packed, bias)
    return y.to(x.dtype).reshape(*x.shape[:-1], int(packed.shape[0]))


class PackedLinear(nn.Module):
    """Drop-in for a bf16 nn.Linear, its weight held only in oneDNN's blocked layout.

    The packed tensor is not a parameter or buffer: state dicts, dtype casts and the RSS
    accounting see none of it (an opaque oneDNN tensor has no storage to read). `weight`
    answers what transformers asks of it (its dtype and device: Qwen2-VL's tower reads
    `blocks[0].mlp.fc2.weight.dtype`).
    """

    bias: torch.Tensor | None

    def __init__(self, packed: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = (int(n) for n in packed.shape)
        self.packed = packed
        self.register_buffer("bias", None if bias is None else bias.detach().to(packed.dtype))

    @property
    def weight(self) -> torch.Tensor:
        return self.packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return packed_forward(x, self.packed, self.bias)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, {self.packed.dtype} packed"
        )


class _FusedGroup:
    """One packed GEMM for several linears that read the same input (a decoder layer's
    q/k/v projections; its MLP's gate and up): the output of the last call, split."""

    def __init__(self, packed: torch.Tensor, bias: torch.Tensor | None, widths: list[int]):
        self.packed = packed
        self.bias = bias
        self.widths = widths
        self.input: torch.Tensor | None = None
        self.parts: list[torch.Tensor] = []
        self.taken = 0


class FusedPart(nn.Module):
    """One linear of a fused group, a drop-in for the nn.Linear it replaced.

    The group's first part computes every part's output in one call and keeps the others'
    for them; each other part hands its slice back when called on the SAME input tensor, as
    transformers' Qwen2 attention (q, k, v of the hidden states) and MLP (gate, then up, of
    its input) call them. Called on anything else, a later part raises: it holds no weight
    of its own, and a silent recomputation would need one.

    Why: a one-row decode step is ~170 small GEMVs whose fixed cost per call is a good part
    of their time (k and v are 229 KB each); three calls as one and two as one read the same
    bytes in fewer calls. Each output element is the same fp32-accumulated dot product over
    the same input row, so the bits are those of the separate calls (a test holds them).
    """

    def __init__(self, group: _FusedGroup, part: int) -> None:
        super().__init__()
        self.group = group
        self.part = part
        self.in_features = int(group.packed.shape[1])
        self.out_features = group.widths[part]

    @property
    def weight(self) -> torch.Tensor:
        return self.group.packed  # its dtype and device, for whoever asks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        group = self.group
        if self.part == 0:
            out = packed_forward(x, group.packed, group.bias)
            group.input, group.parts = x, list(torch.split(out, group.widths, dim=-1))
            group.taken = 1
            return group.parts[0]
        if group.input is not x or group.taken != self.part:
            raise RuntimeError(
                "a fused projection was called without its group's first one on the same "
                "input just before (transformers' decoder layer no longer calls them so?)"
            )
        part = group.parts[self.part]
        group.taken += 1
        if group.taken == len(group.widths):  # the last one: hold no activations
            group.input, group.parts = None, []
        return part

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"part {self.part} of {len(self.group.widths)}, packed"
        )


# Linears of one decoder layer that read the same input, in the order transformers' Qwen2
# modules call them (attention: q, k, v; MLP: gate, then up).
FUSED_GROUPS = (("self_attn", ("q_proj", "k_proj", "v_proj")), ("mlp", ("gate_proj", "up_proj")))


Release = Callable[[list[tuple[int, int]]], None]


def fuse_decoder_projections(layers: nn.Module, release: Release | None = None) -> int:
    """In each decoder layer under `layers`, pack q/k/v as one weight and gate/up as one
    (`FusedPart`s in place of the bf16 nn.Linears); return how many groups. Stops at the
    first weight oneDNN refuses, as pack_linears does."""
    fused = 0
    # Only the layers are listed (not every module): a replaced nn.Linear is then freed as
    # it goes, its weight not held beside the packed copy until the end.
    owners = [m for m in layers.modules() if any(hasattr(m, o) for o, _ in FUSED_GROUPS)]
    for module in owners:
        for owner_name, names in FUSED_GROUPS:
            owner = getattr(module, owner_name, None)
            linears = [getattr(owner, name, None) for name in names]
            plain = [lin for lin in linears if type(lin) is nn.Linear]
            if len(plain) != len(names) or any(lin.weight.dtype != torch.bfloat16 for lin in plain):
                continue
            biases = [lin.bias for lin in plain]
            if any(b is None for b in biases) and any(b is not None for b in biases):
                continue  # some with a bias, some without: left alone
            weight = torch.cat([lin.weight.detach() for lin in plain])
            packed = pack_weight(weight)
            del weight
            if packed is None:
                return fused
            bias = None
            if biases[0] is not None:
                bias = torch.cat([b.detach() for b in biases if b is not None]).to(packed.dtype)
            group = _FusedGroup(packed, bias, [lin.out_features for lin in plain])
            old = [(lin.weight.data_ptr(), lin.weight.untyped_storage().nbytes()) for lin in plain]
            for part, name in enumerate(names):
                setattr(owner, name, FusedPart(group, part))
            del linears, plain
            if release is not None:
                release(old)
            fused += 1
    return fused


def pack_linears(module: nn.Module, rows_hint: int = 1, release: Release | None = None) -> int:
    """Swap every bf16 nn.Linear under `module` for a PackedLinear; return how many.

    Each replaced weight is dropped as it goes, and `release` is handed its (pointer,
    bytes): a weight still in the checkpoint's file mapping (a bf16 tower loaded as stored)
    would otherwise stay counted in the worker's RSS beside its packed copy, the whole
    tower twice (4.2 GB peak on the realistic page against 2.7). Stops at the first weight
    oneDNN refuses: then it refuses all of them on this CPU.
    """
    swapped = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is not nn.Linear or child.weight.dtype != torch.bfloat16:
                continue
            weight = child.weight
            packed = pack_weight(weight, rows_hint)
            if packed is None:
                return swapped
            setattr(parent, name, PackedLinear(packed, child.bias))
            old = [(weight.data_ptr(), weight.untyped_storage().nbytes())]
            del child, weight
            if release is not None:
                release(old)
            swapped += 1
    return swapped


def pack_model(qwen: nn.Module, release: Release | None = None) -> str:
    """Pack a loaded Qwen2-VL's bf16 weights (the loader's call, where bf16 is native): the
    vision tower's linears, a bf16 decoder's linears (the `bf16` precision; the int8
    recipe's layers are not nn.Linear) and the head, plain or the int8 recipe's KeptHead.
    What was packed, for the runtime's details ("vision+head", ...; "none")."""
    model: Any = qwen  # transformers' class: its submodules by name
    parts = []
    if pack_linears(model.model.visual, rows_hint=1024, release=release):
        parts.append("vision")
    decoder = model.model.language_model
    fused = fuse_decoder_projections(decoder, release)
    if pack_linears(decoder, rows_hint=8, release=release) or fused:
        parts.append("decoder")
    head = model.lm_head
    weight: torch.Tensor = head.weight
    if type(head) is nn.Linear:
        packed = pack_weight(weight, rows_hint=8)
        if packed is not None:
            model.lm_head = PackedLinear(packed, head.bias)
        packed_head = packed is not None
    else:
        pack = getattr(head, "pack", None)  # KeptHead.pack (int8_linear imports this module)
        packed_head = callable(pack) and bool(pack())
    if packed_head:
        parts.append("head")
        # The plain weight stays for the tied embeddings' lookups, which read a few rows a
        # step: where it lies in a file mapping (the checkpoint, the int8 decoder cache)
        # its pages come back one lookup at a time instead of staying resident, all 272 MB.
        if release is not None:
            release([(weight.data_ptr(), weight.untyped_storage().nbytes())])
    return "+".join(parts) or "none"
