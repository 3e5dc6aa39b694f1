"""Build a random-weight MinerU2.5-shaped checkpoint for benchmarks (offline, idempotent).

Speed and memory of a transformer do not depend on its weight values, so a checkpoint with
the real architecture (``shape.json``: Qwen2-VL, ~1.16B parameters) but random weights
measures load time, per-token decode cost, vision-tower cost and peak RSS honestly. What it
cannot measure is accuracy, or where the real model stops generating (the benchmark forces
the number of generated tokens instead).

The folder is a complete checkpoint that docinbox's production loader accepts unchanged:
config.json (+ generation_config.json), model.safetensors in bfloat16 (~2.2 GB, like the
published checkpoint), a byte-level BPE tokenizer trained offline on generated text and
padded to the real vocabulary (151,643 regular ids, then the Qwen2-VL special tokens at
their real ids and MinerU's extra tokens after them), the Qwen2-VL image processor config
(min/max pixels = Qwen2-VL defaults) and the chat template.

    python bench/make_model.py                 # -> ~/.cache/docinbox-bench/mineru2.5-shape
    python bench/make_model.py --out DIR --shape PATH --force
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_SHAPE = REPO.parent / "shared" / "models" / "mineru2.5-shape" / "shape.json"
DEFAULT_OUT = Path("~/.cache/docinbox-bench/mineru2.5-shape").expanduser()
MARKER = ".bench-model-complete"

# Qwen2's regular BPE vocabulary ends at 151642; its special tokens follow at fixed ids.
QWEN_FIRST_SPECIAL_ID = 151643
QWEN_SPECIALS = (
    "<|endoftext|>",  # 151643
    "<|im_start|>",  # 151644
    "<|im_end|>",  # 151645
    "<|object_ref_start|>",  # 151646
    "<|object_ref_end|>",  # 151647
    "<|box_start|>",  # 151648
    "<|box_end|>",  # 151649
    "<|quad_start|>",  # 151650
    "<|quad_end|>",  # 151651
    "<|vision_start|>",  # 151652
    "<|vision_end|>",  # 151653
    "<|vision_pad|>",  # 151654
    "<|image_pad|>",  # 151655
    "<|video_pad|>",  # 151656
)
# MinerU2.5's own output tokens not in Qwen2-VL's list (ids assumed: appended in order).
MINERU_EXTRA_SPECIALS = (
    "<|ref_start|>",
    "<|ref_end|>",
    "<|rotate_up|>",
    "<|rotate_right|>",
    "<|rotate_down|>",
    "<|rotate_left|>",
)
# Qwen2-VL image processor defaults: 56*56 .. 28*28*1280 pixels.
MIN_PIXELS = 56 * 56
MAX_PIXELS = 28 * 28 * 1280


def _training_text() -> list[str]:
    sys.path.insert(0, str(REPO))
    from tests.tinymodel import _training_text as tiny_text

    lines: list[str] = tiny_text()
    return lines


def build_tokenizer(folder: Path, vocab_size: int) -> dict[str, int]:
    """Write tokenizer files to `folder`; return {special token: id}."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    sys.path.insert(0, str(REPO))
    from tests.tinymodel import CHAT_TEMPLATE

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=2000,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_training_text(), trainer=trainer)

    # Pad the regular vocabulary to Qwen2's size with unreachable filler tokens (ASCII, so
    # the byte-level decoder can print them), then put the special tokens at their real ids
    # *inside the model vocab*: the added-token table then reuses those ids.
    spec: dict[str, Any] = json.loads(bpe.to_str())
    vocab: dict[str, int] = spec["model"]["vocab"]
    next_id = max(vocab.values()) + 1
    if next_id > QWEN_FIRST_SPECIAL_ID:
        raise RuntimeError("trained vocabulary larger than Qwen2's regular vocabulary")
    for i in range(next_id, QWEN_FIRST_SPECIAL_ID):
        vocab[f"fill{i}"] = i
    specials = {tok: QWEN_FIRST_SPECIAL_ID + i for i, tok in enumerate(QWEN_SPECIALS)}
    first_extra = QWEN_FIRST_SPECIAL_ID + len(QWEN_SPECIALS)
    specials.update({tok: first_extra + i for i, tok in enumerate(MINERU_EXTRA_SPECIALS)})
    if max(specials.values()) >= vocab_size:
        raise RuntimeError("special token ids exceed the model's vocab_size")
    vocab.update(specials)
    spec["added_tokens"] = [
        {
            "id": token_id,
            "content": tok,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for tok, token_id in specials.items()
    ]
    padded = Tokenizer.from_str(json.dumps(spec))

    make_tokenizer: Any = PreTrainedTokenizerFast  # untyped constructor
    tokenizer: Any = make_tokenizer(
        tokenizer_object=padded,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        model_max_length=32768,
        additional_special_tokens=list(specials),
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    for tok, token_id in specials.items():
        got = tokenizer.convert_tokens_to_ids(tok)
        if got != token_id:
            raise RuntimeError(f"tokenizer maps {tok} to {got}, expected {token_id}")
    tokenizer.save_pretrained(folder)
    (folder / "chat_template.json").write_text(
        json.dumps({"chat_template": CHAT_TEMPLATE}), encoding="utf-8"
    )
    return specials


def build_config(shape: dict[str, Any], ids: dict[str, int]) -> Any:
    from transformers import Qwen2VLConfig

    text = dict(shape["text_config"])
    rope = text.pop("rope_scaling", None) or {}
    text["rope_parameters"] = {
        "rope_type": "default",
        "rope_theta": text.pop("rope_theta", 1000000.0),
        "mrope_section": list(rope.get("mrope_section", [16, 24, 24])),
    }
    text.update(
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
    )
    vision = dict(shape["vision_config"])
    make_config: Any = Qwen2VLConfig
    config = make_config(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=bool(shape.get("tie_word_embeddings", True)),
    )
    config.architectures = list(shape.get("architectures", ["Qwen2VLForConditionalGeneration"]))
    return config


def build(folder: Path, shape_path: Path) -> None:
    import torch
    from transformers import GenerationConfig, Qwen2VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    shape: dict[str, Any] = json.loads(shape_path.read_text(encoding="utf-8"))
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    ids = build_tokenizer(folder, int(shape["text_config"]["vocab_size"]))
    make_image_processor: Any = Qwen2VLImageProcessorPil
    make_image_processor(
        min_pixels=MIN_PIXELS,
        max_pixels=MAX_PIXELS,
        patch_size=14,
        merge_size=2,
        temporal_patch_size=2,
    ).save_pretrained(folder)
    print(f"tokenizer + processor: {time.monotonic() - t0:.1f}s", flush=True)

    config = build_config(shape, ids)
    torch.manual_seed(0)
    # Random init directly in bf16: the checkpoint is stored in bf16 like the real one, and
    # this halves build memory/time. Values are N(0, initializer_range): no denormals.
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        model: Any = Qwen2VLForConditionalGeneration(config)
    finally:
        torch.set_default_dtype(previous)
    model.eval()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model init: {n_params / 1e9:.3f}B parameters, {time.monotonic() - t0:.1f}s", flush=True)
    make_generation_config: Any = GenerationConfig
    model.generation_config = make_generation_config(
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]],
        pad_token_id=ids["<|endoftext|>"],
        do_sample=False,
    )
    model.config.dtype = torch.bfloat16
    model.save_pretrained(folder)
    size = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    print(f"saved {size / 1e9:.2f} GB of safetensors in {time.monotonic() - t0:.1f}s", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", type=Path, default=DEFAULT_SHAPE)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--force", action="store_true", help="rebuild even when present")
    args = parser.parse_args(argv)
    out: Path = args.out.expanduser()
    if (out / MARKER).is_file() and not args.force:
        print(f"{out}: already built (delete it or pass --force to rebuild)")
        return 0
    if (out / MARKER).is_file():
        (out / MARKER).unlink()
    build(out, args.shape)
    (out / MARKER).write_text("ok\n", encoding="utf-8")
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
