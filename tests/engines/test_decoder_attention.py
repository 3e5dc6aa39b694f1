"""The decoder's grouped attention for verify passes gives SDPA's values (decoder_attention.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from daemon.engines.mineru.runtimes.decoder_attention import grouped_attention_forward


class Attention(nn.Module):
    """What the attention functions read of transformers' module."""

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True
        self.eval()


def inputs(
    dtype: torch.dtype, positions: int, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows of a verify pass: 3 rows, 14 query heads over 2 key/value heads (Qwen2's 7
    groups), a cache of 20 columns with left padding and holes, `positions` new ones."""
    g = torch.Generator().manual_seed(seed)
    rows, columns = 3, 20 + positions
    query = torch.randn(rows, 14, positions, 16, generator=g).to(dtype)
    key = torch.randn(rows, 2, columns, 16, generator=g).to(dtype)
    value = torch.randn(rows, 2, columns, 16, generator=g).to(dtype)
    mask = torch.ones(rows, 1, positions, columns, dtype=torch.bool)
    mask[1, :, :, :5] = False  # left padding
    mask[2, :, :, 8:11] = False  # holes: rejected draft positions
    causal = torch.ones(positions, positions, dtype=torch.bool).tril()
    mask[:, :, :, -positions:] &= causal
    return query, key, value, mask


@pytest.mark.parametrize("positions", [1, 2, 5, 16])
def test_grouped_heads_give_sdpa_values_in_fp32(positions: int) -> None:
    module = Attention(7)
    query, key, value, mask = inputs(torch.float32, positions)
    stock, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.25)
    grouped, _ = grouped_attention_forward(module, query, key, value, mask, scaling=0.25)
    assert grouped.shape == stock.shape == (3, positions, 14, 16)
    torch.testing.assert_close(grouped, stock, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("positions", [1, 4])
def test_grouped_heads_in_bf16_within_bf16_rounding(positions: int) -> None:
    module = Attention(7)
    query, key, value, mask = inputs(torch.bfloat16, positions, seed=1)
    stock, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.25)
    grouped, _ = grouped_attention_forward(module, query, key, value, mask, scaling=0.25)
    torch.testing.assert_close(grouped.float(), stock.float(), rtol=0.016, atol=0.016)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_step_without_a_mask_attends_to_the_whole_cache(dtype: torch.dtype) -> None:
    """A decode step of rows without padding: transformers passes no mask; one position
    then attends to every cached column, folded as with a mask."""
    module = Attention(7)
    query, key, value, _mask = inputs(dtype, 1, seed=2)
    stock, _ = sdpa_attention_forward(module, query, key, value, None, scaling=0.25)
    grouped, _ = grouped_attention_forward(module, query, key, value, None, scaling=0.25)
    tolerance = 1e-6 if dtype == torch.float32 else 0.016
    torch.testing.assert_close(grouped.float(), stock.float(), rtol=tolerance, atol=tolerance)


def test_what_it_does_not_fold_goes_to_transformers_unchanged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import transformers.integrations.sdpa_attention as sdpa_module

    calls: list[int] = []

    def spy(module: nn.Module, query: torch.Tensor, *args: object, **kwargs: object) -> object:
        calls.append(query.shape[2])
        return sdpa_attention_forward(module, query, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sdpa_module, "sdpa_attention_forward", spy)
    module = Attention(7)
    one = inputs(torch.float32, 1)
    grouped_attention_forward(module, *one, scaling=0.25)  # one position: folded here too
    query, key, value, _mask = inputs(torch.float32, 3)
    grouped_attention_forward(module, query, key, value, None, scaling=0.25)  # no mask
    assert calls == [3]
