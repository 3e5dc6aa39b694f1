"""int8 linears for a vision tower: int8 weights times per-token dynamic int8 activations.

A vision tower is compute-bound (thousands of patches per image run through every linear):
weight bytes do not matter there, multiply throughput does. On CPUs with VNNI (AMD Zen 4,
Intel since Cascade Lake) or AMX, `torch._int_mm` (int8 x int8 -> int32, oneDNN) runs at
584-833 GOP/s where a bf16 GEMM of the same shape reaches ~205-380 GFLOP/s
(docs/benchmarks.md). So both operands are int8 here (W8A8):

- weights: symmetric, one scale per output channel (int8_linear.quantize_rows), quantised
  once at load;
- activations: symmetric, one scale per token (row), computed at every call from the row's
  own maximum. Per token, not per tensor: one scale for a whole activation tensor is what
  wrecks PyTorch's dynamic int8 (int8_linear's docstring), because a few tokens carry
  activations orders of magnitude above the rest;
- y = (q_x @ q_w^T) * s_x[:, None] * s_w[None, :] + b, the product and the scaling in
  int32 / fp32, the output in the input's dtype (fp32 or bf16 tower);
- optionally (w8a8-mixed) a few input channels, those whose calibrated activations stand
  out, multiplied in fp32 beside the int8 product instead of inside it (LLM.int8's split).

`torch._int_mm` is fast only where oneDNN serves it (VNNI/AMX): on an AVX2-only CPU (Zen 2)
it ran at ~3 GOP/s, 36x slower than an fp32 GEMM (docs/benchmarks.md, 2026-12-06), so no
tower built here can pay on that class.

Whether a trained tower keeps its output under this is measured, not assumed:
bench/fidelity_vision.py runs a trained ViT through `quantize_tower_linears` and holds it to
a gate set from bf16's own figures (tests/engines/test_fidelity_vision.py in the suite). Not wired
into `auto` yet (see docs/benchmarks.md, 2026-12-05).

Imports torch at module level: only the worker's model loader and the benches import it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from daemon.engines.mineru.runtimes.int8_linear import (
    Int8WeightOnlyLinear,
    KeepsDtype,
    quantize_rows,
)

# The recipes a tower's linears can be converted with, and the label status/meta would name.
VISION_INT8_LABELS = {
    "w8a8": "int8-w8a8-per-token",  # Int8DynamicLinear
    "w8a8-smooth": "int8-w8a8-per-token-smoothed",  # the same, SmoothQuant-migrated
    "weight-only": "int8-weight-only",  # Int8WeightOnlyLinear (dequantised GEMM: no speed-up)
    "w8a8-mixed": "int8-w8a8-per-token-fp32-outliers",  # Int8DynamicLinear with `outliers`
}

# LLM.int8-style decomposition (w8a8-mixed): the input channels whose calibrated max |x|
# stands out are multiplied in fp32, the rest in int8. "Stands out": above OUTLIER_RATIO x
# the median channel's max, at most OUTLIER_FRACTION of the channels (the largest first).
# Decided from the activations alone, so any tower gets its own set per linear.
OUTLIER_RATIO = 4.0
OUTLIER_FRACTION = 0.02


class Int8DynamicLinear(KeepsDtype):
    """Drop-in for nn.Linear: int8 weights (per output channel) x int8 activations (per
    token), multiplied by `torch._int_mm` into int32 and rescaled in fp32."""

    weight_t: torch.Tensor  # int8, (in_features, out_features): _int_mm's B operand
    scales: torch.Tensor  # fp32, (out_features,)
    bias: torch.Tensor | None  # fp32
    inverse_smooth: torch.Tensor | None  # fp32, (in_features,): x / s before quantising
    outliers: torch.Tensor | None  # int64, (k,): input channels multiplied in fp32
    outlier_weight_t: torch.Tensor | None  # fp32, (k, out_features): their weight columns
    # Scales and bias stay fp32 when the tower around the layer is cast to bf16: the
    # rescale of the int32 product is done in fp32 and only its result takes the tower's dtype.
    kept = ("scales", "bias", "inverse_smooth", "outlier_weight_t")

    def __init__(
        self,
        weight_int8: torch.Tensor,
        scales: torch.Tensor,
        bias: torch.Tensor | None,
        inverse_smooth: torch.Tensor | None = None,
        outliers: torch.Tensor | None = None,
        outlier_weight: torch.Tensor | None = None,
    ) -> None:
        """`outliers` (k,) and `outlier_weight` (out_features, k): input channels left out
        of the int8 product (their columns of `weight_int8` are zero) and computed in fp32."""
        super().__init__()
        shape = tuple(weight_int8.shape)
        if weight_int8.dtype != torch.int8 or len(shape) != 2 or scales.shape != shape[:1]:
            raise ValueError("a 2-D int8 weight and one scale per output channel expected")
        self.out_features, self.in_features = int(shape[0]), int(shape[1])
        # Stored transposed and contiguous once, so that no call pays for a layout change.
        self.register_buffer("weight_t", weight_int8.t().contiguous())
        self.register_buffer("scales", scales.float().contiguous())
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.register_buffer(
            "inverse_smooth", None if inverse_smooth is None else inverse_smooth.float()
        )
        if (outliers is None) != (outlier_weight is None):
            raise ValueError("outlier channels and their weight columns go together")
        self.register_buffer("outliers", None if outliers is None else outliers.long())
        self.register_buffer(
            "outlier_weight_t",
            None if outlier_weight is None else outlier_weight.float().t().contiguous(),
        )

    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        smooth: torch.Tensor | None = None,
        outliers: torch.Tensor | None = None,
    ) -> Int8DynamicLinear:
        """`smooth` (in_features,): SmoothQuant's per-input-channel factors s, moved from
        the activations into the weights (x / s times W * s: the same product) so that
        the few channels carrying outlier activations no longer set every token's scale.
        `outliers` (k,): input channels kept out of the int8 product altogether and
        multiplied in fp32 with their own weight columns (LLM.int8's decomposition); their
        columns do not count towards the int8 weight's scales either."""
        weight = linear.weight.detach().float()
        outlier_weight = None
        if outliers is not None and outliers.numel():
            outlier_weight = weight[:, outliers].clone()
            weight = weight.index_fill(1, outliers, 0.0)
        else:
            outliers = None
        if smooth is not None:
            weight = weight * smooth.float()[None, :]
        q, scales = quantize_rows(weight, torch.float32)
        inverse = None if smooth is None else 1.0 / smooth.float()
        return cls(q, scales, linear.bias, inverse, outliers, outlier_weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).float()
        kept = None
        if self.outliers is not None:
            kept = rows.index_select(1, self.outliers)
            # Zeroed, so that they set no token's scale (their weight columns are zero too).
            rows = rows.index_fill(1, self.outliers, 0.0)
        if self.inverse_smooth is not None:
            rows = rows * self.inverse_smooth
        # One scale per token; an all-zero row gets scale 1 (its q is all zeros anyway).
        token_scales = rows.abs().amax(dim=1, keepdim=True).div_(127.0)
        token_scales = torch.where(token_scales > 0, token_scales, torch.ones_like(token_scales))
        q = torch.round(rows / token_scales).to(torch.int8)
        y = torch._int_mm(q, self.weight_t).float()
        y.mul_(token_scales).mul_(self.scales)
        if kept is not None:
            assert self.outlier_weight_t is not None
            y.addmm_(kept, self.outlier_weight_t)
        if self.bias is not None:
            y.add_(self.bias)
        out: torch.Tensor = y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return out

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, activations=int8 per token"
            + ("" if self.outliers is None else f", {len(self.outliers)} channels fp32")
        )


def smoothing_factors(
    weight: torch.Tensor, activation_max: torch.Tensor, alpha: float = 0.5
) -> torch.Tensor:
    """SmoothQuant's s_j = max|X_j|^alpha / max|W_j|^(1-alpha) per input channel j, from the
    channel's calibrated activation maximum and the weight column's maximum."""
    w_max = weight.detach().float().abs().amax(dim=0).clamp_min(1e-5)
    x_max = activation_max.float().clamp_min(1e-5)
    return (x_max.pow(alpha) / w_max.pow(1 - alpha)).clamp_min(1e-5)


def outlier_channels(
    activation_max: torch.Tensor,
    ratio: float = OUTLIER_RATIO,
    fraction: float = OUTLIER_FRACTION,
) -> torch.Tensor:
    """The input channels (int64 indices, sorted) whose calibrated max |x| exceeds `ratio`
    times the median channel's, the largest first and at most `fraction` of them."""
    seen = activation_max.float()
    limit = max(1, int(fraction * seen.numel()))
    order = torch.argsort(seen, descending=True)[:limit]
    chosen = order[seen[order] > ratio * seen.median()]
    return torch.sort(chosen).values


def activation_maxima(tower: nn.Module, run: Callable[[], object]) -> dict[str, torch.Tensor]:
    """Per-input-channel max |x| seen by each nn.Linear under `tower` (by dotted name from
    `tower`) while `run()` runs calibration inputs through it."""
    maxima: dict[str, torch.Tensor] = {}
    handles = []
    for name, module in tower.named_modules():
        if type(module) is not nn.Linear:
            continue

        def hook(_: nn.Module, args: tuple[torch.Tensor, ...], name: str = name) -> None:
            seen = args[0].detach().float().abs().reshape(-1, args[0].shape[-1]).amax(dim=0)
            maxima[name] = torch.maximum(maxima[name], seen) if name in maxima else seen

        handles.append(module.register_forward_pre_hook(hook))
    try:
        with torch.inference_mode():
            run()
    finally:
        for handle in handles:
            handle.remove()
    return maxima


def quantize_tower_linears(
    tower: nn.Module,
    recipe: str,
    *,
    maxima: dict[str, torch.Tensor] | None = None,
    alpha: float = 0.5,
    outlier_ratio: float = OUTLIER_RATIO,
    outlier_fraction: float = OUTLIER_FRACTION,
    dense_dtype: torch.dtype = torch.float32,
    release: Callable[[list[tuple[int, int]]], None] | None = None,
) -> int:
    """Swap every nn.Linear under `tower` for its int8 form (`recipe`: a VISION_INT8_LABELS
    key); return how many. Any nn.Module tower: Qwen2-VL's, or the bench's trained ViT.

    `maxima`, for w8a8-smooth and w8a8-mixed: activation_maxima of the same tower
    (SmoothQuant's `alpha`; the outlier channels' `outlier_ratio` and `outlier_fraction`).
    `dense_dtype`, for the weight-only recipe: the GEMM dtype its dequantised weights run in.
    `release` is handed each replaced weight's (pointer, bytes), as in store_linears_bf16.
    """
    if recipe not in VISION_INT8_LABELS:
        raise ValueError(f"unknown vision int8 recipe {recipe!r}")
    if recipe in ("w8a8-smooth", "w8a8-mixed") and maxima is None:
        raise ValueError(f"{recipe} needs the tower's activation maxima")
    swapped = 0
    for prefix, parent in list(tower.named_modules()):
        for name, child in list(parent.named_children()):
            if type(child) is not nn.Linear:
                continue
            old = [(t.data_ptr(), t.untyped_storage().nbytes()) for t in child.parameters()]
            layer: nn.Module
            if recipe == "w8a8":
                layer = Int8DynamicLinear.from_linear(child)
            elif recipe == "w8a8-smooth":
                assert maxima is not None
                seen = maxima[f"{prefix}.{name}" if prefix else name]
                smooth = smoothing_factors(child.weight, seen, alpha)
                layer = Int8DynamicLinear.from_linear(child, smooth)
            elif recipe == "w8a8-mixed":
                assert maxima is not None
                seen = maxima[f"{prefix}.{name}" if prefix else name]
                outliers = outlier_channels(seen, outlier_ratio, outlier_fraction)
                layer = Int8DynamicLinear.from_linear(child, outliers=outliers)
            else:
                layer = Int8WeightOnlyLinear.from_linear(child, torch.bfloat16, dense_dtype)
            setattr(parent, name, layer)
            del child
            if release is not None:
                release(old)
            swapped += 1
    return swapped
