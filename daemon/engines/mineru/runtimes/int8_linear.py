"""Linear layers whose weights are stored narrower than they compute with.

- Int8WeightOnlyLinear: int8 weights with one scale per output channel, activations kept in
  bf16/fp32 (the decoder's layers).
- KeptHead / KeptEmbedding: the output head in bf16 beside an fp32 residual stream, shared
  with a tied model's embeddings.
- Bf16StoredLinear: bf16 weights widened to fp32 as they are used (the vision tower where it
  computes in fp32, from a bf16 checkpoint: the same values at half the memory).

Decoding one token reads every weight of the decoder once, so its speed is set by the bytes
read: int8 weights halve bf16's. What must not be quantised is the activation: one scale for
a whole activation tensor (PyTorch's dynamic int8) is wiped out by the huge activation of
the first token that trained LLMs carry, and the fidelity bench (bench/fidelity.py) measures
what that costs. Here only the weights are rounded (per output channel, symmetric, 127
levels, like llama.cpp's Q8_0 but with one scale per row instead of per 32 values).

Imports torch at module level: only the worker's model loader and the benches import it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from daemon.engines.mineru.runtimes.packed_linear import pack_weight, packed_linear

# From this many rows on (a prefill, not a decode step) a call dequantises the weight and
# runs a dense GEMM: the int8 kernel is a matrix-vector kernel whose cost grows linearly with
# rows (1,024 rows x 4,864 x 896: 322 ms against 27 ms for bf16 GEMM on AMX).
DENSE_ROWS = 32

# torch's CPU kernel reads the input dimension in chunks: other sizes crash it (torch 2.13:
# a segfault at K=33, wrong values at K=40). Such layers take the dense path.
KERNEL_K_MULTIPLE = 32

# Byte alignment torch's int8 kernel assumes without checking (torch 2.13, AVX-512 build):
# it loads 16 int8 weights with `vmovdqa xmm` (16-byte aligned) in its 4-row blocks and 16
# bf16 activations with `vmovdqa ymm` (32-byte aligned), so a tensor off those boundaries
# is a SIGSEGV, not an error. torch's own allocator aligns to 64; tensors read from a
# safetensors file (the decoder cache) sit wherever the header's length puts them: 24 bytes
# past a 64-byte boundary for the tiny test checkpoint. Both are copied to fresh memory then.
KERNEL_ALIGNMENT = 64

# Rows of the head widened to fp32 at a time where bf16 is emulated (KeptHead): 512 x 896
# fp32 is 1.8 MB, cache-resident while its GEMM runs. bench/bench_kernels.py head: fastest
# with MKL on AVX-512; with MKL capped to AVX2 too, 1,024 was ~3 ms faster for 8 rows.
HEAD_SLICE = 512


class KeepsDtype(nn.Module):
    """A module whose `kept` tensors keep their dtype through `module.to(dtype)` casts.

    The loaders cast whole decoders and towers (`decoder.to(float32)`, `cast_in_chunks`);
    these layers hold tensors in a dtype chosen on purpose (int8 scales in the kernel's
    activation dtype, a bf16 head or stored weight), which such a cast must not change. A
    device move still applies to them.
    """

    kept: tuple[str, ...] = ()

    def _apply(self, fn: Any, recurse: bool = True) -> KeepsDtype:
        saved = {name: getattr(self, name) for name in self.kept}
        super()._apply(fn, recurse)  # type: ignore[no-untyped-call]
        for name, tensor in saved.items():
            moved = getattr(self, name)
            setattr(self, name, None if tensor is None else tensor.to(moved.device))
        return self


class Int8WeightOnlyLinear(KeepsDtype):
    """Drop-in for nn.Linear: y = x @ (q * s[:, None]).T + b, with q int8 and s per row.

    `compute_dtype` is what activations are cast to for the int8 kernel (bf16: the fast
    kernel; fp32 is exact but ~4x slower than a dense fp32 GEMM in torch 2.13); the scales
    are stored in it, and were chosen representable in it, so no per-channel gain error
    creeps in. `dense_dtype` is the GEMM dtype of large calls (bf16 where the CPU has bf16
    units, fp32 where bf16 would be emulated). The output is in the input's dtype, the bias
    added in fp32 (or the input's dtype).
    """

    weight_int8: torch.Tensor
    scales: torch.Tensor
    bias: torch.Tensor | None
    # The kernel requires scales in the activation dtype: keep them as quantised.
    kept = ("scales",)

    def __init__(
        self,
        weight_int8: torch.Tensor,
        scales: torch.Tensor,
        bias: torch.Tensor | None,
        dense_dtype: torch.dtype,
    ) -> None:
        super().__init__()
        if weight_int8.dtype != torch.int8 or weight_int8.dim() != 2:
            raise ValueError("weight_int8 must be a 2-D int8 tensor")
        if scales.shape != (weight_int8.shape[0],):
            raise ValueError("one scale per output channel expected")
        self.out_features, self.in_features = (int(n) for n in weight_int8.shape)
        self.compute_dtype = scales.dtype
        self.dense_dtype = dense_dtype
        self.register_buffer("weight_int8", kernel_ready(weight_int8))
        self.register_buffer("scales", kernel_ready(scales))
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        self.use_kernel = self.in_features % KERNEL_K_MULTIPLE == 0

    @classmethod
    def from_linear(
        cls, linear: nn.Linear, compute_dtype: torch.dtype, dense_dtype: torch.dtype
    ) -> Int8WeightOnlyLinear:
        q, scales = quantize_rows(linear.weight, compute_dtype)
        bias = None if linear.bias is None else linear.bias.detach().float()
        return cls(q, scales, bias, dense_dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if self.use_kernel and rows.shape[0] < DENSE_ROWS:
            y = torch.ops.aten._weight_int8pack_mm(
                kernel_ready(rows.to(self.compute_dtype)), self.weight_int8, self.scales
            )
        else:
            weight = (
                self.weight_int8.to(self.dense_dtype) * self.scales.to(self.dense_dtype)[:, None]
            )
            y = F.linear(rows.to(self.dense_dtype), weight)
        y = y.to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        out: torch.Tensor = y.reshape(*x.shape[:-1], self.out_features)
        return out

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, activations={self.compute_dtype}"
        )


def kernel_ready(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor`, or a contiguous copy of it in fresh memory where it is not contiguous or
    not KERNEL_ALIGNMENT-aligned (see there: torch's int8 kernel crashes on such input).

    A decode step's activations are fresh tensors, so the check is all it costs there.
    """
    if tensor.is_contiguous() and tensor.data_ptr() % KERNEL_ALIGNMENT == 0:
        return tensor
    return tensor.clone(memory_format=torch.contiguous_format)


def quantize_rows(
    weight: torch.Tensor, scale_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row int8: (q, s) with weight ~= q * s[:, None], |q| <= 127.

    The scale is rounded to `scale_dtype` BEFORE the weights are divided by it, so the
    kernel multiplies by exactly the scale the weights were rounded against.
    """
    w = weight.detach().float()
    amax = w.abs().amax(dim=1)
    scales = (amax / 127.0).to(scale_dtype)
    # An all-zero row (or one whose scale underflows) gets scale 1: its q is all zeros anyway.
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    q = torch.round(w / scales.float()[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scales


class KeptHead(KeepsDtype):
    """The output head left unquantised, in its own float dtype (bf16: the checkpoint's own
    values for MinerU2.5), beside a decoder whose residual stream is fp32.

    The head scores every vocabulary entry at every step, so its rounding decides ties
    between close tokens: int8 there cost the fidelity gate most of its margin
    (bench/fidelity.py). Logits come back in the input's dtype.

    `widen_rows`: where bf16 is emulated (AVX2), a bf16 GEMM over several rows is slow (8
    rows x 151,936 x 896: 67 ms against 14 ms for one row, torch 2.13, bench_kernels.py
    head), so calls of more than one row widen the weight to fp32 a slice of HEAD_SLICE rows
    at a time (the slice stays in cache) and run fp32 GEMMs: 42 ms for 8 rows. They
    compute what the bf16 GEMM computes (inputs rounded to bf16, products summed in fp32,
    logits rounded to bf16), so a row's logits do not depend on how many rows share the
    step, and the numerics stay the ones the fidelity gate measured.
    """

    weight: torch.Tensor
    bias: torch.Tensor | None
    kept = ("weight", "bias")  # a later `.to(float32)` of the model must not widen the head

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None, widen_rows: bool = False
    ) -> None:
        super().__init__()
        self.out_features, self.in_features = (int(n) for n in weight.shape)
        self.register_buffer("weight", weight)
        self.register_buffer("bias", None if bias is None else bias.detach().to(weight.dtype))
        self.widen_rows = widen_rows and weight.dtype != torch.float32
        # oneDNN's blocked copy of the weight (packed_linear), where the loader made one.
        self.packed: torch.Tensor | None = None

    def pack(self) -> bool:
        """Keep a copy of the weight in oneDNN's blocked layout and compute with it; whether
        one was made. Where bf16 is native only (the loader's call): one row took 11.5-14
        ms instead of 21-23 on Zen 4, the same bits. The plain weight stays, for the tied
        embeddings' lookups: the copy costs the head's size again (272 MB for MinerU2.5)."""
        if self.widen_rows:
            return False
        self.packed = pack_weight(self.weight, rows_hint=8)
        return self.packed is not None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Always as 2-D rows. A prefill asks for the last position's logits only
        # (logits_to_keep=1): a [1, 1, hidden] view of the prompt's states, whose batch
        # stride is the prompt's length. torch's matmul (2.13) does not fold such a view
        # into a 2-D GEMM when the weight needs no grad (a buffer, as here; nn.Linear's
        # Parameter does): it runs a batched GEMM over the weight expanded and, in bf16,
        # copies all of it first, 151,936 x 896: ~0.7 s a prefill on Zen 4, more than a
        # short block's whole prompt. The decode loop prefills every row alone, so a page
        # paid it ~18 times (docs/benchmarks.md, 2026-12-07). As rows: ~20 ms, same values.
        rows = x.reshape(-1, self.in_features)
        if self.packed is not None:
            scored = packed_linear(rows.to(self.weight.dtype), self.packed, self.bias)
            return scored.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        if not self.widen_rows or rows.shape[0] == 1:
            y: torch.Tensor = F.linear(rows.to(self.weight.dtype), self.weight, self.bias)
            return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        # Rounded to the weight's dtype first, as the one-row path rounds them.
        wide = rows.to(self.weight.dtype).float()
        out = torch.empty(rows.shape[0], self.out_features, dtype=self.weight.dtype)
        for start in range(0, self.out_features, HEAD_SLICE):
            stop = min(start + HEAD_SLICE, self.out_features)
            bias = None if self.bias is None else self.bias[start:stop].float()
            out[:, start:stop] = F.linear(wide, self.weight[start:stop].float(), bias)
        return out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        widened = ", several rows widened to fp32" if self.widen_rows else ""
        widened += ", packed" if self.packed is not None else ""
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"{self.weight.dtype}{widened}"
        )


class KeptEmbedding(KeepsDtype):
    """Token embeddings that share the KeptHead's matrix (tied models): one copy in the
    head's dtype, looked up rows widened to `out_dtype` for the fp32 residual stream."""

    weight: torch.Tensor
    kept = ("weight",)

    def __init__(
        self, weight: torch.Tensor, padding_idx: int | None, out_dtype: torch.dtype
    ) -> None:
        super().__init__()
        self.register_buffer("weight", weight)
        self.padding_idx = padding_idx
        self.out_dtype = out_dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight, self.padding_idx).to(self.out_dtype)


class Bf16StoredLinear(KeepsDtype):
    """nn.Linear whose weight is kept in bf16 and widened to the input's dtype per call.

    For a bf16 checkpoint run in fp32 (the vision tower where bf16 would be emulated) the
    widened weight holds exactly the values an fp32 copy would, so the output is the same
    bits, while the resident weight takes half the memory: the fp32 vision tower of
    MinerU2.5 is 2.7 GB, and on such CPUs it was what kept the worker above 4 GB. The cost
    is one bf16 -> fp32 conversion of the weight per call, small beside a GEMM over
    thousands of patches.
    """

    weight: torch.Tensor
    bias: torch.Tensor | None
    kept = ("weight",)  # a cast of the tower to fp32 widens the bias, never the weight

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        if weight.dtype != torch.bfloat16:
            raise ValueError("Bf16StoredLinear keeps bf16 weights only")
        self.out_features, self.in_features = (int(n) for n in weight.shape)
        self.register_buffer("weight", weight)
        self.register_buffer("bias", None if bias is None else bias.detach())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, self.weight.to(x.dtype), bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, stored bf16"
