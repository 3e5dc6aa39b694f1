"""The decoder's attention for a few query positions per row: grouped heads without copies.

Qwen2's decoder (MinerU2.5's) has 14 query heads over 2 key/value heads. For one query
position transformers folds each group's 7 query heads into 7 query rows of its key/value
head (`pack_gqa`) and calls SDPA on the cache as it is. For more than one position with a
mask (the decode loop's verify passes: [last token, draft...] per row) it copies every
layer's keys and values 7 times (`repeat_kv`) and runs SDPA over 14 heads. On the real shape
with 1,300-token prompts that copy and the slower attention cost 111 of a 245 ms pass of
4 rows x 3 positions on Zen 4 (`bench/profile_page.py verify`, docs/benchmarks.md, 2026-12-07),
which made drafted passes dear at a page's context.

A bf16 decoder (the `bf16` precision) pays even for one position: torch's bf16 flash kernel
took 1.44 ms a layer for one row over a 1,300-token cache on Zen 4 (34 of a 107 ms step),
the same call folded 0.15 ms. So one position is folded here too.

Here the folding is done for any number of positions: query (B, 14, q, d) -> (B, 2, 7q, d),
the mask's q rows repeated for each of the 7 heads, SDPA over the 2 key/value heads, and the
output unfolded. Each output row is the same dot products, softmax and weighted sum as
before (SDPA's rows are independent), on the same tensors. Anything else (several positions
without a mask, long prompts, per-head masks, dropout) goes to transformers' own function
unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

# The name the function is registered under in transformers' ALL_ATTENTION_FUNCTIONS.
ATTENTION_NAME = "docinbox_grouped_sdpa"
# Up to this many query positions the folded mask (7 x positions x columns a row) stays
# small; prefills (hundreds of positions) keep transformers' path.
MAX_POSITIONS = 64


def grouped_attention_forward(
    module: torch.nn.Module,  # transformers' attention module (num_key_value_groups read)
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: object,  # the rest of transformers' attention-interface keywords
) -> tuple[torch.Tensor, None]:
    """transformers' attention-interface signature: (B, heads, q, d) in, (B, q, heads, d)
    out, as its SDPA function returns it."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = int(getattr(module, "num_key_value_groups", 1))
    batch, heads, positions, dim = query.shape
    # One position needs no mask where no row is padded (transformers then passes none):
    # it attends to the whole cache.
    unmasked_step = positions == 1 and attention_mask is None and not kwargs.get("is_causal")
    folded = (
        groups > 1
        and 1 <= positions <= MAX_POSITIONS
        and (
            unmasked_step
            or (
                attention_mask is not None
                and attention_mask.dim() == 4
                and attention_mask.shape[1] == 1
                and attention_mask.shape[2] == positions
            )
        )
        and not (module.training and dropout)
        and kwargs.get("position_bias") is None
        and kwargs.get("softcap") is None
        and key.shape[1] * groups == heads
    )
    if not folded:
        # Its keywords pass through as transformers sent them, whatever their types.
        sdpa: Callable[..., tuple[torch.Tensor, None]] = sdpa_attention_forward
        return sdpa(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
            **kwargs,
        )  # fmt: skip
    kv_heads = key.shape[1]
    rows = groups * positions
    # Head h = g * groups + r (repeat_kv's order) at position p -> row r * positions + p of
    # key/value head g.
    q = query.reshape(batch, kv_heads, rows, dim)
    mask = None
    if attention_mask is not None:
        mask = attention_mask.unsqueeze(2).expand(-1, -1, groups, -1, -1)
        mask = mask.reshape(attention_mask.shape[0], 1, rows, attention_mask.shape[-1])
    out = F.scaled_dot_product_attention(q, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(batch, heads, positions, dim).transpose(1, 2).contiguous(), None


def use_grouped_attention(text_config: object) -> bool:
    """Route a loaded Qwen2 decoder's attention (`text_config`: the config its layers read)
    through `grouped_attention_forward`; whether it was (only over SDPA)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    if getattr(text_config, "_attn_implementation", None) != "sdpa":
        return False
    # transformers' own (global) tables; registering again is harmless. The masks are built
    # as for SDPA: a name without a mask function would get no mask at all.
    AttentionInterface.register(ATTENTION_NAME, grouped_attention_forward)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
    text_config._attn_implementation = ATTENTION_NAME  # type: ignore[attr-defined]
    return True
