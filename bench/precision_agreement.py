"""Greedy-token agreement of each precision with fp32, on a random tiny Qwen2-VL.

The real MinerU2.5 weights cannot be downloaded where this was written, so the accuracy cost
of bf16 and int8 on them is UNVERIFIED. What can be measured is how often each precision's
greedy decoding picks the same token as fp32 on the same inputs, for a model of the same
architecture with random weights: tests/tinymodel.py's checkpoint, its scripted decoder
replaced by random weights (fixed seed, 1/sqrt(fan_in) scale), saved and then loaded through
docinbox's own loader (`load_model`) in each precision. This says how much the numerics of
each path disturb a decoder in general; it says nothing about the real model, whose
trained logits are far more peaked (fewer near-ties) than a random model's.

    python bench/precision_agreement.py [--tokens 48] [--out FILE.json]

Prints per precision: exact whole-output matches, tokens agreeing before the first
divergence, and position-wise agreement, over a layout request and block crops.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PRECISIONS = ("fp32", "bf16", "mixed", "int8", "bf16-int8", "int8-dynamic", "bf16-int8-dynamic")


def random_checkpoint(folder: Path) -> Path:
    import torch
    from transformers import Qwen2VLForConditionalGeneration

    sys.path.insert(0, str(REPO))
    from tests.tinymodel import randomize_language_model, tiny_model_once

    tiny = tiny_model_once(folder / "tiny")
    model: Any = Qwen2VLForConditionalGeneration.from_pretrained(str(tiny), dtype=torch.float32)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        randomize_language_model(model, generator)
        model.lm_head.weight.copy_(torch.randn(model.lm_head.weight.shape, generator=generator))
    out = folder / "random"
    model.save_pretrained(str(out))
    for name in tiny.iterdir():
        if name.suffix in (".json", ".jinja", ".txt") and not (out / name.name).exists():
            (out / name.name).write_bytes(name.read_bytes())
    return out


def requests() -> list[tuple[Any, str]]:
    from PIL import Image, ImageDraw

    page = Image.new("RGB", (850, 1100), "white")
    draw = ImageDraw.Draw(page)
    for row in range(40):
        draw.text((60, 60 + row * 25), f"Line {row}: benchmark text {row * 7}", fill="black")
    items: list[tuple[Any, str]] = [(page, "\nLayout Detection:")]
    prompts = ("\nText Recognition:", "\nTable Recognition:", "\nFormula Recognition:")
    for i in range(12):
        crop = page.crop((40, 50 + i * 80, 40 + 200 + i * 40, 120 + i * 80))
        items.append((crop, prompts[i % 3]))
    return items


def greedy(loaded: Any, items: list[tuple[Any, str]], tokens: int) -> list[list[int]]:
    import torch
    from mineru_vl_utils.vlm_client.transformers_client import TransformersVlmClient

    client = TransformersVlmClient(loaded.model, loaded.processor, use_tqdm=False)
    outs: list[list[int]] = []
    with torch.inference_mode():
        for image, prompt in items:
            text = loaded.processor.apply_chat_template(
                client.build_messages(prompt), tokenize=False, add_generation_prompt=True
            )
            inputs = loaded.processor(text=[text], images=[image], return_tensors="pt")
            inputs = inputs.to(dtype=loaded.model.dtype)
            ids = loaded.model.generate(
                **inputs,
                max_new_tokens=tokens,
                min_new_tokens=tokens,
                do_sample=False,
                no_repeat_ngram_size=100,
            )
            outs.append(ids[0, inputs["input_ids"].shape[1] :].tolist())
    return outs


def agreement(ref: list[list[int]], got: list[list[int]]) -> dict[str, float]:
    exact = sum(a == b for a, b in zip(ref, got, strict=True))
    prefix = 0
    same = 0
    total = 0
    for a, b in zip(ref, got, strict=True):
        k = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), len(a))
        prefix += k
        same += sum(x == y for x, y in zip(a, b, strict=False))
        total += len(a)
    return {
        "exact_outputs": exact / len(ref),
        "tokens_before_first_divergence": prefix / total,
        "positionwise": same / total,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=48, help="greedy tokens per request")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from daemon.engines.mineru.runtimes.transformers_model import load_model

    items = requests()
    results: dict[str, Any] = {"requests": len(items), "tokens": args.tokens, "precisions": {}}
    with tempfile.TemporaryDirectory(prefix="agreement-") as tmp:
        folder = random_checkpoint(Path(tmp))
        outputs: dict[str, list[list[int]]] = {}
        for precision in PRECISIONS:
            t0 = time.monotonic()
            loaded = load_model(str(folder), None, precision=precision)
            outputs[precision] = greedy(loaded, items, args.tokens)
            seconds = time.monotonic() - t0
            # Agreement figures plus how long it took and the dtypes used, for the report.
            row: dict[str, Any] = dict(agreement(outputs["fp32"], outputs[precision]))
            row["seconds"] = round(seconds, 1)
            row["dtypes"] = f"{loaded.dtype_vision} / {loaded.dtype_decoder}"
            results["precisions"][precision] = row
    print(f"{len(items)} requests x {args.tokens} greedy tokens, random tiny Qwen2-VL, vs fp32")
    print(
        "| precision | vision / decoder | exact outputs | tokens before 1st divergence "
        "| position-wise |"
    )
    print("|---|---|---|---|---|")
    for precision, row in results["precisions"].items():
        print(
            f"| {precision} | {row['dtypes']} | {100 * row['exact_outputs']:.0f} % "
            f"| {100 * row['tokens_before_first_divergence']:.1f} % "
            f"| {100 * row['positionwise']:.1f} % |"
        )
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
