"""Build a tiny random Qwen2-VL checkpoint offline, shaped like MinerU2.5's, in seconds.

The real weights cannot be downloaded in CI, but the engine must still load a folder
exactly as a user's machine would (config.json, safetensors, tokenizer files,
preprocessor_config.json, chat template) and run every stage of a page. So this writes a
complete checkpoint folder with the same architecture and file layout, only tiny.

Random weights would emit noise for the layout step, which MinerU's parser turns into zero
blocks, and then the recognition stage would never run. To exercise the whole pipeline the
decoder is wired as a deterministic "bigram machine": attention and MLP outputs are zeroed, so
the residual stream at each position is just the embedding of the current token, and the
(untied) lm_head maps each token of a fixed chain to the next one. Greedy decoding after
the chat template's "assistant" prompt therefore always writes one valid layout line:

    <|box_start|>100 100 900 500<|box_end|><|ref_start|>text<|ref_end|><|rotate_up|><|im_end|>

The layout step then yields one text block, recognition runs on its crop (and "reads" that
same string back), post-processing and Markdown assembly run on it. The vision tower stays
random: its output only lands on image-token positions, which the zeroed attention ignores.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

# The layout line the tiny model writes; tests assert on the block it describes.
TINY_BOX = "100 100 900 500"
TINY_TYPE = "text"
TINY_LAYOUT = f"<|box_start|>{TINY_BOX}<|box_end|><|ref_start|>{TINY_TYPE}<|ref_end|><|rotate_up|>"

QWEN_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
MINERU_SPECIAL_TOKENS = (
    "<|box_start|>",
    "<|box_end|>",
    "<|ref_start|>",
    "<|ref_end|>",
    "<|rotate_up|>",
    "<|rotate_right|>",
    "<|rotate_down|>",
    "<|rotate_left|>",
)

# A Qwen2-VL style chat template (system turn default, image placeholder per image part).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _training_text() -> list[str]:
    """Generated corpus for the BPE: prompts, layout vocabulary, OTSL, digits, prose."""
    prose = (
        "Layout Detection Text Recognition Table Formula Image Analysis system user "
        "assistant You are a helpful the of and to in is that for on with as text title "
        "table equation image caption footer header list_item page_number <fcel> <ecel> "
        "<lcel> <ucel> <xcel> <nl> \\frac{a}{b} x^2 + y_1 = \\alpha"
    )
    words = prose.split(" ")
    lines = [" ".join(words[i:] + words[:i]) for i in range(len(words))]
    lines += [" ".join(str(n) for n in range(k, k + 40)) for k in range(0, 1000, 40)]
    return lines * 4


def build_tiny_model(folder: Path) -> Path:
    """Write a complete tiny MinerU2.5-shaped checkpoint to `folder`; return `folder`."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (
        GenerationConfig,
        PreTrainedTokenizerFast,
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
    )
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)

    # --- tokenizer: byte-level BPE like Qwen2's, plus Qwen2-VL and MinerU special tokens.
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    special = list(QWEN_SPECIAL_TOKENS + MINERU_SPECIAL_TOKENS)
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_training_text(), trainer=trainer)
    # The box coordinates and the block type become single (non-special) tokens so the
    # chain below never repeats a token: a bigram machine cannot revisit one.
    bpe.add_tokens([TINY_BOX, TINY_TYPE])
    make_tokenizer: Any = PreTrainedTokenizerFast  # untyped constructor
    tokenizer: Any = make_tokenizer(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        model_max_length=4096,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    (folder / "chat_template.json").write_text(
        json.dumps({"chat_template": CHAT_TEMPLATE}), encoding="utf-8"
    )

    def tid(token: str) -> int:
        token_id = tokenizer.convert_tokens_to_ids(token)
        assert isinstance(token_id, int)
        return token_id

    # --- image processor: small max_pixels keeps every image at <= 16 vision tokens.
    image_processor = Qwen2VLImageProcessorPil(
        min_pixels=28 * 28,
        max_pixels=28 * 28 * 16,
        patch_size=14,
        merge_size=2,
        temporal_patch_size=2,
    )
    image_processor.save_pretrained(folder)

    # --- model: MinerU2.5's layout (Qwen2-VL), a few layers, tiny dims.
    hidden = 64
    config = Qwen2VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": hidden,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 4096,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": [2, 3, 3],  # sums to head_dim / 2 = 8
            },
            "bos_token_id": tid("<|endoftext|>"),
            "eos_token_id": tid("<|im_end|>"),
            "pad_token_id": tid("<|endoftext|>"),
            "tie_word_embeddings": False,
        },
        vision_config={
            "depth": 2,
            "embed_dim": 32,
            "hidden_size": hidden,
            "num_heads": 2,
            "mlp_ratio": 2,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
        image_token_id=tid("<|image_pad|>"),
        video_token_id=tid("<|video_pad|>"),
        vision_start_token_id=tid("<|vision_start|>"),
        vision_end_token_id=tid("<|vision_end|>"),
        tie_word_embeddings=False,
    )
    model: Any = Qwen2VLForConditionalGeneration(config)
    model.eval()

    # --- the bigram machine (see module docstring).
    messages: Any = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "x"}]}
    ]
    prompt = tokenizer.apply_chat_template(
        messages,
        tokenize=False,
        add_generation_prompt=True,
    )
    assert isinstance(prompt, str)
    last_prompt_token = tokenizer(prompt, add_special_tokens=False)["input_ids"][-1]
    chain = [last_prompt_token, *tokenizer(TINY_LAYOUT, add_special_tokens=False)["input_ids"]]
    chain.append(tid("<|im_end|>"))
    if len(set(chain)) != len(chain):
        raise AssertionError(f"tiny layout chain repeats a token: {chain}")
    with torch.no_grad():
        text_model = model.model.language_model
        for layer in text_model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        text_model.norm.weight.fill_(1.0)
        emb = text_model.embed_tokens.weight
        head = model.lm_head.weight
        head.normal_(0.0, 0.01)
        for prev, nxt in itertools.pairwise(chain):
            direction = emb[prev] / emb[prev].norm()
            head[nxt] = direction * 20.0

    make_generation_config: Any = GenerationConfig  # untyped constructor
    model.generation_config = make_generation_config(
        bos_token_id=tid("<|endoftext|>"),
        eos_token_id=[tid("<|im_end|>"), tid("<|endoftext|>")],
        pad_token_id=tid("<|endoftext|>"),
        do_sample=False,
    )
    model.save_pretrained(folder)
    return folder


def tiny_model_once(folder: Path) -> Path:
    """`build_tiny_model` unless `folder` already holds a finished build (marker file last)."""
    marker = folder / ".tiny-model-complete"
    if not marker.is_file():
        build_tiny_model(folder)
        marker.write_text("ok\n", encoding="utf-8")
    return folder


def randomize_language_model(model: Any, generator: Any) -> None:
    """Give the decoder random weights with the usual 1/sqrt(fan_in) scale, embeddings too.

    The scripted tiny model always answers the same string; with a random decoder its
    outputs depend on image and prompt, which is what batching and precision checks need.
    The caller decides the head. Call inside torch.no_grad().
    """
    import torch

    for param in model.model.language_model.parameters():
        if param.dim() == 2:
            param.copy_(torch.randn(param.shape, generator=generator) * param.shape[1] ** -0.5)
    embed = model.model.language_model.embed_tokens.weight
    embed.copy_(torch.randn(embed.shape, generator=generator))


def make_random_reader(engine: Any, seed: int = 1) -> None:
    """Turn a loaded tiny `MinerUEngine` into a reader whose answers depend on its input.

    Random decoder and head (fixed seed), and the end-of-turn token made to win wherever
    the token that one probe row writes fourth would have won: some rows then end early and
    others run to their cap, so rows of a batch end at different steps. The layout parser
    is swapped for `blocks_from_any_text`: a random decoder never writes MinerU's layout
    grammar, and each page must still get blocks of its own for the block step.
    """
    import torch
    from PIL import Image, ImageDraw

    client = engine.runtime.client.client
    model, processor = client.model, client.processor
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        randomize_language_model(model, generator)
        head = model.lm_head.weight
        head.copy_(torch.randn(head.shape, generator=generator) * 0.125)
        image = Image.new("RGB", (500, 300), "white")
        ImageDraw.Draw(image).rectangle((40, 2, 499, 150), outline="red")
        text = processor.apply_chat_template(
            client.build_messages("\nTable Recognition:"),
            tokenize=False,
            add_generation_prompt=True,
        )
        inputs = processor(text=[text], images=[image], return_tensors="pt")
        ids = model.generate(**inputs, max_new_tokens=4, do_sample=False)
        eos = processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
        head[eos] = head[int(ids[0, -1])] * 1.5
    engine.runtime.client.helper.parse_layout_output = blocks_from_any_text


def blocks_from_any_text(output: str) -> list[Any]:
    """1-3 layout blocks whose types and boxes follow the raw layout text (see above).

    Deterministic in `output`, so a page whose layout step generated other tokens gets
    other blocks: a batch that changed a layout row would change the page's block work.
    """
    from mineru_vl_utils.structs import ContentBlock

    code = sum(map(ord, output))
    kinds = ("text", "table", "equation", "title")
    blocks = []
    for i in range(1 + code % 3):
        x0 = 0.05 + 0.1 * ((code >> i) % 3)
        y0 = 0.05 + 0.3 * i
        blocks.append(ContentBlock(kinds[(code // 3 + i) % 4], [x0, y0, 0.95, y0 + 0.1 + 0.05 * i],
                                   angle=0))
    return blocks
