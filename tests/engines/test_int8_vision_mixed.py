"""The w8a8-mixed decomposition of int8_vision: input channels whose calibrated activations
stand out are multiplied in fp32 beside the int8 product (LLM.int8's split).

Numerics only (no speed): the outlier channels are chosen from the activations, not from
names; leaving them out of the int8 product removes what they cost plain per-token W8A8;
and with no channel standing out the layer is plain W8A8, bit for bit.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from daemon.engines.mineru.runtimes.int8_vision import (
    Int8DynamicLinear,
    activation_maxima,
    outlier_channels,
    quantize_tower_linears,
)


def _inputs(outliers: list[int]) -> torch.Tensor:
    torch.manual_seed(0)
    x = torch.randn(64, 256)
    x[:, outliers] *= 60.0  # a few channels two orders of magnitude above the rest
    return x


def test_the_outlier_channels_are_the_ones_that_stand_out() -> None:
    x = _inputs([3, 70, 200])
    assert outlier_channels(x.abs().amax(dim=0)).tolist() == [3, 70, 200]
    # At most OUTLIER_FRACTION of the channels, the largest first: 2 % of 256 is 5.
    many = _inputs(list(range(0, 256, 16)))
    assert len(outlier_channels(many.abs().amax(dim=0))) == 5
    # Nothing stands out in plain Gaussian activations.
    assert outlier_channels(torch.randn(64, 256).abs().amax(dim=0)).numel() == 0


def test_fp32_outlier_channels_remove_what_they_cost_per_token_w8a8() -> None:
    torch.manual_seed(1)
    linear = nn.Linear(256, 96)
    x = _inputs([3, 70])
    with torch.inference_mode():
        exact = linear(x)
        plain = Int8DynamicLinear.from_linear(linear)(x)
        mixed = Int8DynamicLinear.from_linear(linear, outliers=torch.tensor([3, 70]))(x)
    err_plain = float((plain - exact).norm() / exact.norm())
    err_mixed = float((mixed - exact).norm() / exact.norm())
    assert err_mixed < err_plain / 5, (err_plain, err_mixed)


def test_a_tower_without_outliers_gets_plain_w8a8() -> None:
    torch.manual_seed(2)
    tower = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64))
    x = torch.randn(32, 64)
    maxima = activation_maxima(tower, lambda: tower(x))
    plain, mixed = copy.deepcopy(tower), copy.deepcopy(tower)
    assert quantize_tower_linears(plain, "w8a8") == 2
    assert quantize_tower_linears(mixed, "w8a8-mixed", maxima=maxima, outlier_ratio=1e9) == 2
    with torch.inference_mode():
        assert torch.equal(plain(x), mixed(x))
