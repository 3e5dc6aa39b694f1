"""Where one decode step of `auto` goes, and two routes tried to make it cheaper.

The random model of the real shape (bench/make_model.py), loaded by the engine's own
load_model with `--precision` (default auto), a 448 x 448 page image and MinerU's layout
prompt, greedy with no_repeat_ngram_size=100 as MinerU decodes:

- `profile`: torch's profiler over 20 decode steps (after 5), ops by self time.
- `inference-mode`: ms per step, generate() under no_grad (its own) against under
  torch.inference_mode(), three alternations.
- `compile`: ms per step eager, then the decoder's forward through torch.compile
  (inductor, dynamic shapes): the first compiled call's seconds, then ms per step.

    python bench/make_model.py
    python bench/probe_step.py profile inference-mode compile

Run alone on the machine: it prints the CPU and the load average before and after.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_kernels import cpu_model
from bench.make_model import DEFAULT_OUT

MODES = ("profile", "inference-mode", "compile")


class Probe:
    def __init__(self, model: Path, precision: str) -> None:
        from PIL import Image

        from daemon.engines.mineru.runtimes.transformers_model import load_model

        loaded = load_model(str(model), None, precision, threads=2)
        self.precision = loaded.precision
        self.qwen, processor = loaded.model, loaded.processor
        image = Image.new("RGB", (448, 448), "white")
        prompt = [{"type": "image"}, {"type": "text", "text": "Layout Detection:"}]
        messages: Any = [{"role": "user", "content": prompt}]  # content lists: wider than
        # transformers' hint (str contents), which chat templates accept
        text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        self.inputs = processor(text=[text], images=[image], return_tensors="pt").to(
            dtype=self.qwen.dtype
        )

    def generate(self, tokens: int, **kwargs: Any) -> float:
        start = time.perf_counter()
        self.qwen.generate(**self.inputs, max_new_tokens=tokens, min_new_tokens=tokens,
                           do_sample=False, no_repeat_ngram_size=100, **kwargs)  # fmt: skip
        return time.perf_counter() - start

    def ms_per_step(self, steps: int = 40) -> float:
        """The difference of a long and a short generate(): the prefill cancels out."""
        short = self.generate(4)
        return (self.generate(4 + steps) - short) / steps * 1000


def profile(probe: Probe) -> None:
    from torch.profiler import ProfilerActivity, profile, schedule
    from transformers import LogitsProcessorList

    prof = profile(activities=[ProfilerActivity.CPU],
                   schedule=schedule(wait=3, warmup=2, active=20))  # fmt: skip

    class Step:
        def __call__(self, ids: Any, scores: Any) -> Any:
            prof.step()
            return scores

    prof.start()
    probe.generate(27, logits_processor=LogitsProcessorList([Step()]))
    prof.stop()
    averages = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in averages) / 20 / 1000
    print(f"self CPU time per step: {total:.1f} ms (the profiler's own cost included)")
    print(averages.table(sort_by="self_cpu_time_total", row_limit=12))


def inference_mode(probe: Probe) -> None:
    import torch

    probe.generate(2)
    print("| no_grad ms/step | inference_mode ms/step |\n|---|---|")
    for _ in range(3):
        plain = probe.ms_per_step(60)
        with torch.inference_mode():
            inference = probe.ms_per_step(60)
        print(f"| {plain:.1f} | {inference:.1f} |", flush=True)


def compile_decoder(probe: Probe) -> None:
    import torch

    probe.generate(2)
    print(f"eager: {probe.ms_per_step():.1f} ms/step", flush=True)
    decoder = probe.qwen.model.language_model
    decoder.forward = torch.compile(decoder.forward, dynamic=True)
    print(f"first compiled generate(): {probe.generate(4):.1f} s", flush=True)
    probe.generate(4)
    print(f"compiled: {probe.ms_per_step():.1f} ms/step")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # No `choices`: argparse (3.11) checks an empty list against them and fails.
    parser.add_argument("modes", nargs="*", help=f"of {', '.join(MODES)} (default: all)")
    parser.add_argument("--model", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--precision", default="auto")
    args = parser.parse_args()
    if unknown := set(args.modes) - set(MODES):
        parser.error(f"unknown mode(s): {', '.join(sorted(unknown))}")
    warnings.simplefilter("ignore")
    print(f"{cpu_model()}, load {os.getloadavg()[0]:.2f}")
    runs = {"profile": profile, "inference-mode": inference_mode, "compile": compile_decoder}
    for mode in args.modes or MODES:
        # A fresh model per mode: compiling replaces the decoder's forward.
        probe = Probe(args.model, args.precision)
        print(f"\n{mode} (precision {probe.precision})", flush=True)
        runs[mode](probe)
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
