"""Loading MinerU2.5 (a Qwen2-VL checkpoint) for CPU inference: weights, processor, precision.

Kept apart from the page pipeline (`engine.py`) and the runtime (`transformers.py`) so
`docinbox model info` can check that a checkpoint loads without pulling in the engine, and
so every torch/transformers import stays inside functions: importing this module costs
nothing in the daemon process.

Precisions (config `engine.precision`; the decoder recipes live in decoder_precision.py,
where the fidelity bench applies the same code to other decoders), and what each costs:

- ``fp32``: reference numerics. Slowest decode, ~4.8 GB RSS for the 1.2B checkpoint.
- ``bf16``: everything in bfloat16, half the memory. Only fast on CPUs with native bf16
  (AVX512_BF16 / AMX); elsewhere PyTorch emulates it and it is *slower* than fp32. bf16 has
  an 8-bit mantissa: the vision tower's patch features are the most sensitive part, which is
  why `mixed` exists.
- ``mixed``: vision tower in fp32 (accurate pixel features, it runs once per image), decoder
  and lm_head in bf16 (memory-bandwidth bound token-by-token decode, where halving the
  weight bytes pays). The merger's output is cast to the decoder dtype.
- ``int8``: vision fp32; every nn.Linear of the decoder and lm_head replaced by a weight-only
  int8 linear (per-output-channel scales, activations in bf16 for the kernel, residual
  stream and attention in fp32). Half of bf16's weight bytes per token; close to fp32 but
  short of the fidelity gate on SmolLM2 (bench/fidelity.py; docs/benchmarks.md), so lossy.
- ``bf16-int8``: vision tower in bf16, decoder int8 as above. Each part gets the dtype that
  is fastest for it on a CPU with native bf16 (AVX512_BF16/AMX): the vision tower is
  compute-bound (bf16 on AMX ~3x faster than fp32), decoding is memory-bound.
- ``int8-dynamic``, ``bf16-int8-dynamic``: the decoder of earlier releases, PyTorch's dynamic
  int8 (activations quantised with one scale per tensor). LOSSY: it changes tokens on real
  trained weights; selectable by name only, and a warning is logged when it is chosen.
- ``auto``: among the precisions that pass the fidelity gate, the one measured fastest for
  this CPU class (docs/benchmarks.md; `auto_precision` says which and why). torch's ISA
  caps count as "not native".

An int8 decoder is prepared once per checkpoint revision, torch version and recipe and kept
on disk (decoder_precision.DecoderCache, verified by size and SHA-256): later starts read
it instead of quantising again.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from daemon.common.cpus import amx_tiles, cpu_flags, native_bf16, resolve_threads, vector_int8
from daemon.common.cpus import isa_caps as isa_caps  # re-exported: the benches read it here
from daemon.common.errors import EngineUnavailable
from daemon.config.settings import EngineConfig
from daemon.config.settings import Precision as PrecisionName
from daemon.engines.mineru.runtimes.decoder_attention import use_grouped_attention
from daemon.engines.mineru.runtimes.decoder_precision import (
    INT8_HEAD_DTYPE,
    LOSSY_WARNING,
    QWEN2_VL,
    DecoderCache,
    Precision,
    default_cache_dir,
    prepare_decoder,
)
from daemon.engines.mineru.runtimes.decoder_precision import PRECISIONS as SPECS
from daemon.engines.mineru.runtimes.vision_attention import use_fastest_attention

if TYPE_CHECKING:
    import torch
    from torch import nn
    from transformers import Qwen2VLForConditionalGeneration, Qwen2VLProcessor

    from daemon.document.page import Json

# Both are declared once, in the configuration: the default model and the precision names
# (the recipes behind the names are decoder_precision.PRECISIONS; a test holds the two
# name lists equal).
DEFAULT_MODEL: str = EngineConfig().model
PRECISIONS: tuple[str, ...] = get_args(PrecisionName)
PULL_HINT = "docinbox model pull"
log = logging.getLogger(__name__)

_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class ResolvedWeights:
    """Where a checkpoint lives on this machine."""

    path: Path  # folder with config.json, *.safetensors, tokenizer and processor files
    model_id: str  # as configured (hub id or folder)
    commit: str | None  # hub commit hash of the snapshot, when known
    local_folder: bool  # True when `model` was a folder rather than a hub id


@dataclass
class LoadedModel:
    model: Qwen2VLForConditionalGeneration
    processor: Qwen2VLProcessor  # ImageOnlyQwen2VLProcessor
    weights: ResolvedWeights
    precision: str  # effective: fp32 | bf16 | mixed | int8 | bf16-int8
    threads: int
    dtype_vision: str
    dtype_decoder: str
    load_seconds: float
    details: dict[str, Json] = field(default_factory=dict)


def looks_like_path(model: str) -> bool:
    """A hub id is `owner/name`; anything else that names a folder is a folder."""
    return model.startswith(("/", ".", "~")) or model.count("/") > 1 or "\\" in model


def commit_of(path: Path) -> str | None:
    """The commit hash when `path` is a snapshot folder of the Hugging Face cache."""
    if path.parent.name == "snapshots" and _COMMIT_RE.match(path.name):
        return path.name
    return None


def resolve_weights(model: str, revision: str | None) -> ResolvedWeights:
    """Find the checkpoint locally, without touching the network.

    The daemon never downloads weights itself: a multi-GB download hidden inside a worker's
    startup would fight the startup timeout and surprise the user. `docinbox model pull`
    downloads explicitly; here we only look in the folder / HF cache, so a box without
    weights (or offline) fails in milliseconds and the daemon can start its fallback engine.
    """
    folder = Path(model).expanduser()
    if folder.is_dir():
        _check_complete(folder, model)
        return ResolvedWeights(folder.resolve(), model, commit_of(folder.resolve()), True)
    if looks_like_path(model):
        raise EngineUnavailable(
            f"model folder {model} does not exist",
            hint="set engine.model to a folder with the MinerU2.5 checkpoint, or to a hub id"
            f" and run `{PULL_HINT}`",
        )

    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        # local_files_only: a cache lookup only, no HTTP (so no network timeouts offline).
        snapshot = Path(
            str(snapshot_download(repo_id=model, revision=revision, local_files_only=True))
        )
    except (LocalEntryNotFoundError, FileNotFoundError) as exc:
        where = f"{model}" + (f"@{revision}" if revision else "")
        raise EngineUnavailable(
            f"MinerU weights {where} are not in the Hugging Face cache "
            f"({_hf_cache_dir()}); the engine does not download them by itself",
            hint=PULL_HINT + (f" --model {model}" if model != DEFAULT_MODEL else ""),
        ) from exc
    except (HFValidationError, ValueError) as exc:
        raise EngineUnavailable(
            f"engine.model {model!r} is neither a folder nor a valid hub id: {exc}",
            hint="set engine.model to a hub id like opendatalab/MinerU2.5-2509-1.2B or a folder",
        ) from exc
    except OSError as exc:
        raise EngineUnavailable(
            f"cannot read the Hugging Face cache for {model}: {exc}", hint=PULL_HINT
        ) from exc
    _check_complete(snapshot, model)
    return ResolvedWeights(snapshot, model, commit_of(snapshot) or revision, False)


def _hf_cache_dir() -> str:
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def _check_complete(folder: Path, model: str) -> None:
    """A half-finished download leaves a snapshot without weights: report it as such."""
    missing = [name for name in ("config.json",) if not (folder / name).is_file()]
    if not any(folder.glob("*.safetensors")) and not any(folder.glob("*.bin")):
        missing.append("*.safetensors")
    if missing:
        raise EngineUnavailable(
            f"MinerU checkpoint at {folder} is incomplete (missing {', '.join(missing)})",
            hint=PULL_HINT + (f" --model {model}" if not looks_like_path(model) else ""),
        )


def auto_precision(
    flags: set[str] | None = None, env: dict[str, str] | os._Environ[str] | None = None
) -> str:
    """The fastest measured combination for this CPU class (docs/benchmarks.md), among the
    precisions that pass the fidelity gate (never a lossy one).

    AVX512_BF16 without AMX (AMD Zen 4/5): `bf16`, the checkpoint's own numerics, its
    weights packed for oneDNN (packed_linear.py). Packed, a bf16 decode step reads its
    weights at ~23 GB/s, a verify pass of several positions costs little more than a step
    (where torch's int8 kernel grows with positions), and prefills need no per-call
    dequantisation: the realistic page in the decode loop 110.0 s against `bf16-int8`'s
    118.6 (Zen 4, alone, 2026-12-07), at +340 MB of peak RSS.

    AMX (not measured since the packing) and AVX512_BF16 capped to it keep `bf16-int8`: the
    weight-only int8 decoder reads half of bf16's bytes per token (on the realistic page
    with AMX, unpacked: 78 s against bf16's 93 s). The vision tower is compute-bound: bf16
    where the CPU has bf16 units, fp32 where bf16 would be emulated (`int8`: the int8
    decoder's steps cost 0.6x bf16's at 1-8 rows there).

    Without a vectorised int8 kernel (the SSE4.2-only class, see `vector_int8`) it is
    `fp32`: no bf16 anywhere (it would be emulated) and a dense fp32 decoder, 3x faster per
    decode step than the scalar int8 kernel there, at ~1.5 GB more memory than `int8` (set
    `precision: int8` on a box short of memory and long on patience).
    """
    flags = cpu_flags() if flags is None else flags
    env = os.environ if env is None else env
    if native_bf16(flags, env):
        return "bf16-int8" if amx_tiles(flags, env) else "bf16"
    return "int8" if vector_int8(flags, env) else "fp32"


def load_processor(folder: Path) -> Qwen2VLProcessor:
    """Image-only Qwen2-VL processor (tokenizer + PIL image processor + chat template).

    transformers' AutoProcessor for Qwen2-VL always builds a video processor, and that one
    requires torchvision, which we do not install (it drags in a CUDA torch). MinerU only
    sends images, so the processor subclass below drops the video slot, and the image
    processor is the PIL implementation regardless of what else is installed.
    """
    from transformers import Qwen2VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    class ImageOnlyQwen2VLProcessor(Qwen2VLProcessor):
        # ProcessorMixin derives its sub-processors from __init__'s parameter names, so
        # leaving `video_processor` out of the signature is what removes the video slot.
        def __init__(
            self,
            image_processor: Any = None,
            tokenizer: Any = None,
            chat_template: str | None = None,
            **kwargs: Any,
        ) -> None:
            super().__init__(  # type: ignore[no-untyped-call]
                image_processor, tokenizer, None, chat_template=chat_template, **kwargs
            )

    processor = ImageOnlyQwen2VLProcessor.from_pretrained(str(folder), local_files_only=True)
    if not isinstance(processor.image_processor, Qwen2VLImageProcessorPil):
        processor.image_processor = Qwen2VLImageProcessorPil.from_pretrained(
            str(folder), local_files_only=True
        )
    return processor


def _tied_config(folder: Path) -> Any:
    """Config with `tie_word_embeddings` taken from the raw config.json.

    Same fix as mineru-vl-utils' own loader: transformers 5 keeps the flag on both the
    top-level and the text sub-config, and MinerU2.5's config.json only sets the top-level
    one. Left alone, transformers >= 5.10 may treat lm_head as untied and randomly
    initialise it (the checkpoint does not store it separately): the model then emits
    garbage. So the raw value wins and is copied to both places.
    """
    from transformers import AutoConfig, PretrainedConfig

    config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
    raw, _ = PretrainedConfig.get_config_dict(str(folder), local_files_only=True)
    text_config = config.get_text_config(decoder=True)
    tied = raw.get("tie_word_embeddings")
    if tied is None:
        tied = text_config.tie_word_embeddings
    text_config.tie_word_embeddings = tied
    config.tie_word_embeddings = tied
    return config


def load_model(
    model: str,
    revision: str | None,
    precision: str = "auto",
    threads: int = 0,
    decoder_cache: Path | None = None,
) -> LoadedModel:
    """Resolve, load and cast MinerU2.5 for CPU inference.

    `decoder_cache`: folder of prepared int8 decoders (default: decoder_precision's
    default_cache_dir()). Raises EngineUnavailable (never a bare traceback) when the weights
    are missing or cannot be loaded.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r} (one of {', '.join(PRECISIONS)})")
    started = time.monotonic()
    weights = resolve_weights(model, revision)

    import torch

    from daemon.engines.mineru.runtimes.packed_linear import pack_model

    n_threads = resolve_threads(threads)
    torch.set_num_threads(n_threads)

    effective = auto_precision() if precision == "auto" else precision
    spec = SPECS[effective]
    if spec.lossy:
        log.warning(LOSSY_WARNING.format(name=effective))
    # MinerU2.5 ships bf16 weights. Loading them as bf16 and up-casting only the parts that
    # run in fp32 gives bit-identical fp32 values (bf16 -> fp32 is exact) at a much lower
    # load peak than from_pretrained(dtype=float32), which peaked at ~7 GB RSS on the real
    # shape. A checkpoint stored in fp32 is loaded as fp32, so nothing is ever rounded.
    stored_bf16 = stored_dtype(weights.path) == "bfloat16"
    load_dtype = torch.bfloat16 if (effective == "bf16" or stored_bf16) else torch.float32
    processor, qwen = _from_pretrained(weights, load_dtype)
    qwen.eval()
    # The decoder first, while the vision tower is still in its stored dtype, so that as
    # little as possible is held twice (the checkpoint stays mapped until loading ends).
    # The int8 recipe quantises straight from the stored weights, layer by layer, and drops
    # each layer's checkpoint pages: the decoder is never materialised in fp32.
    release = _file_page_releaser()
    dtype_decoder = _prepare_decoder(qwen, weights, spec, load_dtype, decoder_cache, release)
    gc.collect()
    vision_dtype = getattr(torch, spec.vision)
    if vision_dtype == torch.float32 and stored_bf16:
        store_linears_bf16(qwen.model.visual, release)
    if qwen.model.visual.dtype != vision_dtype:
        cast_in_chunks(qwen.model.visual, vision_dtype)
    gc.collect()
    use_inplace_quick_gelu(qwen.model.visual)
    packed = pack_model(qwen, release) if native_bf16() else "none"
    attention = use_fastest_attention(qwen.model.visual)  # chunked GEMMs where SDPA is slow
    # The decode loop's verify passes: grouped heads without copying the cache 7 times.
    grouped = use_grouped_attention(qwen.model.language_model.config)
    return_freed_memory()
    keep_freed_memory()  # from here on: see there
    if spec.vision != _first_decoder_float(qwen):
        # The decoder takes the image features in its own dtype.
        _cast_vision_output(qwen, getattr(torch, _first_decoder_float(qwen)))
    return LoadedModel(
        model=qwen,
        processor=processor,
        weights=weights,
        precision=effective,
        threads=n_threads,
        dtype_vision=spec.vision,
        dtype_decoder=dtype_decoder,
        load_seconds=time.monotonic() - started,
        details={
            "vision_attention": attention.kernel,
            "decoder_attention": "grouped" if grouped else "stock",
            "packed_weights": packed,
        },
    )


def _from_pretrained(
    weights: ResolvedWeights, load_dtype: torch.dtype
) -> tuple[Qwen2VLProcessor, Any]:
    """The processor and the model as stored, in `load_dtype`; EngineUnavailable when they
    do not load. The model is Any: load_model reaches into its submodules by name."""
    from transformers import Qwen2VLForConditionalGeneration

    try:
        processor = load_processor(weights.path)
        qwen = Qwen2VLForConditionalGeneration.from_pretrained(
            str(weights.path),  # the resolved snapshot: loading never goes online
            config=_tied_config(weights.path),
            # No device_map: it requires `accelerate`, which is not a dependency; without it
            # from_pretrained loads onto the CPU anyway.
            attn_implementation="sdpa",
            dtype=load_dtype,
            local_files_only=True,
        )
    except Exception as exc:
        # Missing or truncated files in the snapshot (safetensors raises its own error
        # type), a config transformers cannot read, tensors of the wrong shape: all mean
        # "these weights do not load here", which the daemon answers with its fallback
        # engine and a fix, not with a traceback.
        raise EngineUnavailable(
            f"cannot load MinerU checkpoint from {weights.path}: {type(exc).__name__}: {exc}",
            hint=(
                f"{PULL_HINT} (downloads again whatever is missing or damaged)"
                if not weights.local_folder
                else "check that the model folder holds a complete MinerU2.5 checkpoint"
            ),
        ) from exc
    return processor, qwen


def _prepare_decoder(
    qwen: Any,
    weights: ResolvedWeights,
    spec: Precision,
    load_dtype: Any,
    decoder_cache: Path | None,
    release: Callable[[list[tuple[int, int]]], None],
) -> str:
    import torch

    if spec.decoder == "int8":
        cache = DecoderCache.for_checkpoint(
            decoder_cache or default_cache_dir(),
            checkpoint_fingerprint(weights),
            spec.decoder,
            activation_dtype="bfloat16",
            head_dtype=INT8_HEAD_DTYPE,
        )
        dense = "bfloat16" if native_bf16() else "float32"
        return prepare_decoder(
            qwen,
            QWEN2_VL,
            "int8",
            dense_dtype=dense,
            head_dtype=INT8_HEAD_DTYPE,
            cache=cache,
            release=release,
        )
    if spec.decoder in ("float32", "int8-dynamic") and load_dtype == torch.bfloat16:
        # Up-cast block by block (low peak); dynamic int8 wants fp32 Linear weights.
        cast_in_chunks(qwen.model.language_model, torch.float32)
        cast_in_chunks(qwen.lm_head, torch.float32)
    return prepare_decoder(qwen, QWEN2_VL, spec.decoder)


def _first_decoder_float(qwen: Any) -> str:
    """The dtype the decoder's embeddings (hence its hidden states) are in."""
    return str(qwen.model.language_model.embed_tokens.weight.dtype).removeprefix("torch.")


def checkpoint_fingerprint(weights: ResolvedWeights) -> str:
    """What identifies a checkpoint's bytes without reading them: the hub commit when known,
    and every weight/config file's name, size and modification time."""
    parts = [f"commit={weights.commit}", f"path={weights.path}"]
    for path in sorted(weights.path.iterdir()):
        if path.suffix in (".safetensors", ".bin", ".json") and path.is_file():
            stat = path.stat()
            parts.append(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}")
    return "|".join(parts)


def cast_in_chunks(module: nn.Module, dtype: torch.dtype) -> None:
    """`module.to(dtype)`, one block at a time, releasing each block's checkpoint pages.

    transformers maps the safetensors file (MAP_PRIVATE) and the bf16 parameters stay
    views into that mapping; reading them to up-cast makes their pages resident, and they
    stay counted in the worker's RSS until the whole mapping is freed at the end of
    loading. Cast all at once, the bf16 file (2.3 GB) and the fp32 copy (4.6 GB) were
    resident together: a 7 GB peak for a 4.7 GB model. Block by block, with the pages of
    the tensors each block no longer uses released right away, the file adds about one
    block to the peak.
    """
    from torch import nn

    release = _file_page_releaser()  # the mappings do not change while we cast
    for child in module.children():
        blocks = list(child) if isinstance(child, nn.ModuleList) else [child]
        for block in blocks:
            old = [(t.data_ptr(), t.untyped_storage().nbytes()) for t in _tensors(block)]
            block.to(dtype)
            release(old)
    module.to(dtype)  # the module's own parameters, if any; a no-op for the rest


def _tensors(module: Any) -> list[Any]:
    return [*module.parameters(), *module.buffers()]


# madvise(2) advice that drops a range's pages from this process (Linux: 4).
_MADV_DONTNEED = 4
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _file_page_releaser() -> Callable[[list[tuple[int, int]]], None]:
    """A function that drops the resident pages of tensors we just replaced, where they
    lie in a mapping of a *.safetensors file, from this process's RSS.

    Only whole pages strictly inside a replaced tensor are passed, so no neighbour's
    page is touched, and only inside FILE mappings of the checkpoint, never anonymous
    memory (where MADV_DONTNEED would zero data). For a file page the kernel reads the
    page back from the (still cached) file if anything touches it again: the checkpoint's
    own bytes. A no-op where /proc or madvise is not available. The mappings are read
    once, by this call, not once per block.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        madvise = libc.madvise
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            maps = [line.split(maxsplit=5) for line in fh]
    except (OSError, AttributeError):
        return lambda _ranges: None
    files: list[tuple[int, int]] = []
    for fields in maps:
        if len(fields) == 6 and fields[5].rstrip("\n").endswith(".safetensors"):
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            files.append((lo, hi))

    def release(ranges: list[tuple[int, int]]) -> None:
        for ptr, nbytes in ranges:
            start = -(-ptr // _PAGE) * _PAGE  # round up
            stop = (ptr + nbytes) // _PAGE * _PAGE  # round down
            if stop > start and any(lo <= start and stop <= hi for lo, hi in files):
                madvise(start, stop - start, _MADV_DONTNEED)

    return release


def stored_dtype(folder: Path) -> str | None:
    """The dtype config.json says the weights are stored in (`dtype`, or `torch_dtype`)."""
    try:
        raw = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    value = raw.get("dtype") or raw.get("torch_dtype")
    if value is None and isinstance(raw.get("text_config"), dict):
        value = raw["text_config"].get("dtype") or raw["text_config"].get("torch_dtype")
    return str(value) if value else None


def return_freed_memory() -> None:
    """Hand the heap's free memory back to the system (glibc's malloc_trim).

    Loading frees gigabytes (bf16 copies cast, checkpoint tensors replaced), much of it from
    the loader's threads, whose glibc arenas keep freed blocks: with the int8 precision and
    torch capped to AVX2 the worker held 3.3 GB after loading against 1.7 GB after a trim,
    and which of the two a start got varied run to run. A no-op where there is no glibc.
    """
    trim = _glibc("malloc_trim")
    if trim is not None:
        trim(0)


@cache
def _glibc(name: str) -> Callable[..., int] | None:
    """glibc's function `name`, looked up once (the trim runs before every row's join), or
    None where the C library has no such function (musl)."""
    try:
        import ctypes

        function: Callable[..., int] = getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None
    return function


# glibc's mallopt parameters (malloc.h) and the values set by keep_freed_memory.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
# The largest mmap threshold glibc accepts on 64-bit (HEAP_MAX_SIZE / 2): a block up to this
# size comes from the heap, larger ones are mapped and unmapped each time.
MMAP_THRESHOLD = 32 * 1024 * 1024
# Free memory at the top of the heap kept for the next pass instead of returned at once. The
# explicit trims (return_freed_memory: before each row joins the decode loop, after each
# page) still hand it back, so an idle worker does not hold it.
TRIM_THRESHOLD = 1024 * 1024 * 1024


def keep_freed_memory() -> bool:
    """Have glibc keep freed blocks for reuse instead of returning them to the system at
    once; whether it took the settings (False where there is no glibc).

    A vision pass allocates and frees the same activation sizes layer after layer (the
    layout image: 32 layers of [4,900 x 5,120] MLP activations and the like). With glibc's
    default (a threshold that adapts, and the heap's top trimmed when more than twice it is
    free) each layer's blocks came back as fresh pages the kernel had to fault in and zero:
    a million page faults and 2-3 s of system time per layout image on Zen 4. With the
    thresholds fixed the pages are reused within the pass: layout tower 46-50 s -> 43 s
    (docs/benchmarks.md, 2026-12-07).
    """
    mallopt = _glibc("mallopt")
    if mallopt is None:
        return False
    took = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    took = mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and took
    if not took:
        log.info("the C library did not take the heap thresholds; it keeps its own")
    return took


def share_main_arena() -> bool:
    """Have every thread that allocates from now on use glibc's main arena; whether the C
    library took it. Called before the model thread starts (model_thread.py): a thread gets
    its arena at its first allocation.

    keep_freed_memory's thresholds hold in the main arena; another thread's arena lives in
    64 MB heaps that glibc unmaps and shrinks as they empty, whatever the thresholds. The
    layout tower run on a thread of its own took ~785,000 page faults and 1.6 s of system
    time a pass (38.5-40.3 s), on the main thread 0 (36.5-37.8 s) (docs/benchmarks.md,
    2026-12-07, night). One arena costs a lock the model thread rarely shares: page threads
    render and crop between its passes.
    """
    mallopt = _glibc("mallopt")
    return mallopt is not None and mallopt(_M_ARENA_MAX, 1) == 1


def store_linears_bf16(
    module: nn.Module, release: Callable[[list[tuple[int, int]]], None] | None = None
) -> int:
    """Swap every bf16 nn.Linear under `module` for a Bf16StoredLinear; return how many.

    Each weight is copied out of the checkpoint mapping into anonymous memory, and `release`
    is handed the replaced weight's (pointer, bytes) so that the mapping's pages the copy
    read do not stay counted in the worker's RSS beside the copy.
    """
    import torch
    from torch import nn

    from daemon.engines.mineru.runtimes.int8_linear import Bf16StoredLinear

    swapped = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and child.weight.dtype == torch.bfloat16:
                weight = child.weight
                old = [(weight.data_ptr(), weight.untyped_storage().nbytes())]
                stored = Bf16StoredLinear(weight.detach().clone(), child.bias)
                setattr(parent, name, stored)
                del child, weight
                if release is not None:
                    release(old)
                swapped += 1
    return swapped


def use_inplace_quick_gelu(visual: nn.Module) -> int:
    """Swap the vision MLPs' QuickGELU for one that writes into fc1's output; return how many.

    transformers computes x * sigmoid(1.702 * x) with three fresh tensors of the MLP's
    widest shape (patches x 5,120): on a batch of block crops (~10,000 patches) that is
    ~200 MB each in fp32, so the in-place form lowers the worker's peak by one of them and
    spares the page faults of two allocations. Same operations in the same order, so the
    same bits (a test compares them). Only ever run under inference mode, where nothing
    else holds fc1's output.
    """
    import torch
    from torch import nn
    from transformers.activations import QuickGELUActivation

    class InPlaceQuickGELU(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            gate = torch.sigmoid_(x * 1.702)
            return x.mul_(gate)

    swapped = 0
    for block in getattr(visual, "blocks", []):
        mlp = getattr(block, "mlp", None)
        if mlp is not None and type(getattr(mlp, "act", None)) is QuickGELUActivation:
            mlp.act = InPlaceQuickGELU()
            swapped += 1
    return swapped


def _cast_vision_output(qwen: Any, dtype: Any) -> None:
    """Hand the decoder image features in its own dtype.

    transformers' Qwen2-VL casts image embeddings before `masked_scatter` today; the hook
    makes the contract explicit so a refactor upstream cannot turn it into a dtype error.
    """
    merger = qwen.model.visual.merger

    def to_decoder_dtype(_module: Any, _inputs: Any, output: Any) -> Any:
        return output.to(dtype)

    merger.register_forward_hook(to_decoder_dtype)
