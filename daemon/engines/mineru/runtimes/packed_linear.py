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
        rows = x.reshape(-1, self.in_features).to(self.packed.dtype)
        y = packed_linear(rows, self.packed, self.bias)
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, {self.packed.dtype} packed"
        )


Release = Callable[[list[tuple[int, int]]], None]


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
    if pack_linears(model.model.language_model, rows_hint=8, release=release):
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
