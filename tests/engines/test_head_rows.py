"""The output head of every precision runs a prefill's last position as a plain 2-D GEMM."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.mark.parametrize("precision", ["int8", "bf16", "fp32"])
def test_a_prefills_last_position_reaches_the_head_as_one_plain_row(
    tiny_model: Path, tmp_path: Path, precision: str
) -> None:
    """A prefill asks for the last position's logits only: the head's input is then a
    [1, 1, hidden] view whose batch stride is the prompt's length, and torch's matmul runs
    such a view as a batched GEMM over the whole weight expanded (in bf16 it copies the
    weight first: 0.7 s a prefill on the real shape) where the weight needs no grad: the
    int8 recipe's KeptHead, a buffer. Every precision's head must run it as a plain 2-D
    GEMM; the logits are the same."""
    import torch
    from torch.profiler import profile

    from daemon.engines.mineru.runtimes.transformers_model import load_model

    qwen = load_model(str(tiny_model), None, precision, decoder_cache=tmp_path / "c").model
    hidden = int(qwen.lm_head.in_features)
    dtype = qwen.model.language_model.norm.weight.dtype  # the residual stream's
    states = torch.randn(1, 7, hidden, generator=torch.Generator().manual_seed(0)).to(dtype)
    last = states[:, -1:, :]
    assert last.stride()[0] == 7 * hidden  # what logits_to_keep=1 hands the head
    with torch.no_grad(), profile() as run:
        logits = qwen.lm_head(last)
    ops = {event.key for event in run.key_averages()}
    assert "aten::bmm" not in ops, ops
    with torch.no_grad():
        assert torch.equal(logits, qwen.lm_head(last.clone(memory_format=torch.contiguous_format)))
        assert torch.equal(logits[0], qwen.lm_head(states[0, -1:, :]))
