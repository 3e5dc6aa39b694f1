"""Precision recipes: what `engine.precision` does to a model, for any decoder by module name.

One recipe per decoder numerics, applied through `prepare_decoder(model, parts, recipe)`:
the engine passes MinerU2.5's Qwen2-VL module names, the fidelity bench (bench/fidelity.py)
a plain CausalLM's (Llama, Qwen2), so what the bench measures on real trained weights is
exactly what the engine runs.

Recipes (decoder and lm_head; embeddings and norms keep the decoder's float dtype):

- ``float32``, ``bfloat16``: a cast.
- ``int8``: weight-only int8 for the decoder's layers, one scale per output channel,
  activations in bf16 for the kernel, residual stream, norms and attention in fp32
  (int8_linear.py); the output head (and a tied model's embeddings) kept in bf16. Passes
  both gates (SmolLM2 98.90 % / KL 0.0024, Qwen2 99.89 % / 0.0005); with the head quantised
  too it missed SmolLM2's top-1 (98.35 %), which is why the head is kept.
- ``int8-dynamic``: PyTorch's dynamic int8 (int8 weights per channel AND activations
  quantised with one scale per tensor at run time). LOSSY on trained weights: the first
  token's huge activation sets the scale and flattens every other token (SmolLM2: 83 %
  top-1 agreement with fp32). Kept selectable by name only.

Every torch import stays inside functions: the daemon process reads PRECISIONS (names,
lossy flags) without loading torch.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from daemon.config.settings import LOSSY_PRECISIONS

if TYPE_CHECKING:
    import torch
    from torch import nn

    from daemon.engines.mineru.runtimes.int8_linear import Int8WeightOnlyLinear

# A prepared int8 layer as the cache keeps it: (int8 weight, scales, bias or None).
StoredLinear = tuple["torch.Tensor", "torch.Tensor", "torch.Tensor | None"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DecoderParts:
    """Where a model keeps its text decoder and output head (dotted attribute paths)."""

    decoder: str
    lm_head: str


QWEN2_VL = DecoderParts(decoder="model.language_model", lm_head="lm_head")
CAUSAL_LM = DecoderParts(decoder="model", lm_head="lm_head")

RECIPES = ("float32", "bfloat16", "int8", "int8-dynamic")

# The int8 recipe leaves the output head (and, in a tied model, the embeddings sharing its
# matrix) unquantised in bf16: MinerU2.5 ships bf16 weights, so those are the checkpoint's
# own values. The head ranks every token at every step; rounding it to int8 cost the
# SmolLM2 gate its margin (bench/fidelity.py, docs/benchmarks.md).
INT8_HEAD_DTYPE = "bfloat16"


@dataclass(frozen=True)
class Precision:
    """One value of `engine.precision`: the dtype of the vision tower and the decoder recipe."""

    name: str
    vision: str  # "float32" | "bfloat16"
    decoder: str  # one of RECIPES

    @property
    def lossy(self) -> bool:
        """Fails the fidelity gate: never picked by `auto`, warned about when chosen."""
        return self.name in LOSSY_PRECISIONS


PRECISIONS: dict[str, Precision] = {
    p.name: p
    for p in (
        Precision("fp32", "float32", "float32"),
        Precision("bf16", "bfloat16", "bfloat16"),
        Precision("mixed", "float32", "bfloat16"),
        Precision("int8", "float32", "int8"),
        Precision("bf16-int8", "bfloat16", "int8"),
        Precision("int8-dynamic", "float32", "int8-dynamic"),
        Precision("bf16-int8-dynamic", "bfloat16", "int8-dynamic"),
    )
}
LOSSY_WARNING = (
    "engine.precision {name} is lossy: its dynamic int8 decoder fails the fidelity gate "
    "against fp32 on real trained decoders (README, Precision; docs/benchmarks.md): auto, "
    "bf16, mixed or int8 keep the model's tokens"
)

# Labels of the decoder's numerics, as status and the metadata report them.
DECODER_LABELS = {
    "float32": "float32",
    "bfloat16": "bfloat16",
    "int8": "int8-weight-only",
    "int8-dynamic": "qint8-dynamic",
}


def _get(model: Any, dotted: str) -> Any:
    for name in dotted.split("."):
        model = getattr(model, name)
    return model


def _set(model: Any, dotted: str, value: Any) -> None:
    parent, _, name = dotted.rpartition(".")
    setattr(_get(model, parent) if parent else model, name, value)


def linear_names(model: nn.Module, parts: DecoderParts) -> list[str]:
    """Dotted names (from `model`) of every nn.Linear of the decoder, then the lm_head."""
    from torch import nn

    decoder = _get(model, parts.decoder)
    names = [
        f"{parts.decoder}.{name}"
        for name, module in decoder.named_modules()
        if type(module) is nn.Linear
    ]
    if type(_get(model, parts.lm_head)) is nn.Linear:
        names.append(parts.lm_head)
    return names


def prepare_decoder(
    model: nn.Module,
    parts: DecoderParts,
    recipe: str,
    *,
    dense_dtype: str = "float32",
    activation_dtype: str = "bfloat16",
    head_dtype: str | None = INT8_HEAD_DTYPE,
    cache: DecoderCache | None = None,
    release: Callable[[list[tuple[int, int]]], None] | None = None,
) -> str:
    """Apply `recipe` to the decoder and lm_head of `model`, in place; return its label.

    `dense_dtype` is the GEMM dtype of the int8 recipe's large (prefill) calls: bfloat16
    where the CPU computes bf16 natively, else float32. `activation_dtype` is the int8
    kernel's input dtype (bfloat16, the shipped choice; float32 only for the benches).
    `head_dtype`, for the int8 recipe: the float dtype the lm_head is kept in, unquantised
    (None: quantised with the decoder, a bench-only variant).
    `cache`, for the int8 recipe: prepared int8 layers are read from it when it holds them
    (verified), else quantised and written to it. `release` is handed the (pointer, bytes)
    of each replaced weight, so a loader can drop the checkpoint pages behind it.
    """
    import torch

    if recipe not in RECIPES:
        raise ValueError(f"unknown decoder recipe {recipe!r} (one of {', '.join(RECIPES)})")
    decoder = _get(model, parts.decoder)
    head = _get(model, parts.lm_head)
    if recipe in ("float32", "bfloat16"):
        dtype = getattr(torch, recipe)
        decoder.to(dtype)
        head.to(dtype)  # tied with the embeddings: the same Parameter, a no-op then
        return DECODER_LABELS[recipe]
    if recipe == "int8":
        _int8_weight_only(
            model,
            parts,
            getattr(torch, activation_dtype),
            getattr(torch, dense_dtype),
            None if head_dtype is None else getattr(torch, head_dtype),
            cache,
            release,
        )
        # Embeddings, norms, biases: fp32 (the residual stream stays exact).
        cast_floats(decoder, torch.float32)
        return DECODER_LABELS[recipe]
    _int8_dynamic(model, parts)
    return DECODER_LABELS[recipe]


def cast_floats(module: nn.Module, dtype: torch.dtype) -> None:
    """`module.to(dtype)` for float tensors, parameter by parameter (low peak), skipping the
    layers that keep a dtype on purpose (int8 scales, the bf16 head: int8_linear.KeepsDtype)."""
    from daemon.engines.mineru.runtimes.int8_linear import KeepsDtype

    for sub in module.modules():
        if isinstance(sub, KeepsDtype):
            continue
        for param in list(sub.parameters(recurse=False)):
            if param.is_floating_point() and param.dtype != dtype:
                param.data = param.data.to(dtype)
        for name, buf in list(sub.named_buffers(recurse=False)):
            if buf is not None and buf.is_floating_point() and buf.dtype != dtype:
                setattr(sub, name, buf.to(dtype))


def _int8_weight_only(
    model: Any,
    parts: DecoderParts,
    activation: Any,
    dense: Any,
    head: Any,
    cache: DecoderCache | None,
    release: Callable[[list[tuple[int, int]]], None] | None,
) -> None:
    import torch

    from daemon.engines.mineru.runtimes.int8_linear import Int8WeightOnlyLinear

    names = linear_names(model, parts)
    if head is not None:
        names = [name for name in names if name != parts.lm_head]
        _keep_head(model, parts, head, widen_rows=dense == torch.float32)
    stored = cache.load(names) if cache is not None else None
    layers: dict[str, Int8WeightOnlyLinear] = {}
    for name in names:
        linear = _get(model, name)
        old = [(t.data_ptr(), t.untyped_storage().nbytes()) for t in linear.parameters()]
        if stored is not None:
            q, scales, bias = stored[name]
            layer = Int8WeightOnlyLinear(q, scales.to(activation), bias, dense)
        else:
            layer = Int8WeightOnlyLinear.from_linear(linear, activation, dense)
        _set(model, name, layer)
        layers[name] = layer
        del linear
        if release is not None:
            release(old)
    if cache is not None and stored is None:
        cache.save(layers)


def _keep_head(model: Any, parts: DecoderParts, dtype: Any, widen_rows: bool) -> None:
    """Leave the lm_head unquantised, in `dtype`; for a tied model (MinerU2.5, SmolLM2,
    Qwen2.5-0.5B) the embeddings then share that one matrix instead of a second copy.
    `widen_rows`: the CPU emulates bf16 (see KeptHead)."""
    import torch

    from daemon.engines.mineru.runtimes.int8_linear import KeptEmbedding, KeptHead

    decoder = _get(model, parts.decoder)
    linear = _get(model, parts.lm_head)
    embeddings = decoder.get_input_embeddings()
    tied = embeddings.weight.data_ptr() == linear.weight.data_ptr()
    weight = linear.weight.detach().to(dtype)
    _set(model, parts.lm_head, KeptHead(weight, linear.bias, widen_rows))
    if tied:
        decoder.set_input_embeddings(KeptEmbedding(weight, embeddings.padding_idx, torch.float32))


def _int8_dynamic(model: Any, parts: DecoderParts) -> None:
    import torch
    from torch import nn

    from daemon.common.errors import EngineUnavailable

    decoder = _get(model, parts.decoder)
    decoder.to(torch.float32)  # dynamic int8 linears take fp32 weights and activations
    _get(model, parts.lm_head).to(torch.float32)
    try:
        from torch.ao.nn.quantized.dynamic import Linear as DynamicQuantizedLinear
        from torch.ao.quantization import per_channel_dynamic_qconfig
        from torch.ao.quantization import quantize_dynamic as _quantize_dynamic
    except ImportError as exc:  # removed in some future torch
        raise EngineUnavailable(
            "the int8-dynamic decoder needs torch.ao.quantization.quantize_dynamic, which "
            "this torch no longer has",
            hint="set engine.precision: int8",
        ) from exc
    with warnings.catch_warnings():
        # torch >= 2.10 marks torch.ao.quantization deprecated in favour of torchao.
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        quantize_dynamic: Any = _quantize_dynamic  # untyped in torch
        quantize_dynamic(
            model,
            qconfig_spec={
                parts.decoder: per_channel_dynamic_qconfig,
                parts.lm_head: per_channel_dynamic_qconfig,
            },
            dtype=torch.qint8,
            # Linear only: the name-based spec also reaches the embeddings.
            mapping={nn.Linear: DynamicQuantizedLinear},
            inplace=True,
        )
    remaining = [n for n, m in decoder.named_modules() if type(m) is nn.Linear]
    if remaining:  # would silently run fp32; better to know
        raise RuntimeError(f"int8-dynamic: decoder layers left unquantised: {remaining[:3]}")


# Bumped whenever the file layout or the quantisation rule changes: old files then miss.
CACHE_FORMAT = 2


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    return Path(base) / "docinbox" / "decoders"


@dataclass(frozen=True)
class DecoderCache:
    """Prepared int8 decoder layers on disk, so a start does not quantise again.

    Keyed by the checkpoint's fingerprint (revision and file sizes/times), torch's version,
    the recipe with its dtypes, and CACHE_FORMAT. A manifest beside the tensors records their
    file's size and SHA-256: a file that does not match (truncated, edited, a crash while
    writing) is deleted and rebuilt, never loaded.
    """

    folder: Path
    key: str

    @classmethod
    def for_checkpoint(
        cls,
        folder: Path,
        fingerprint: str,
        recipe: str,
        activation_dtype: str,
        head_dtype: str | None,
    ) -> DecoderCache:
        """The cache entry for one checkpoint prepared by one recipe. `head_dtype` has no
        default: it must be the one handed to prepare_decoder, whose default differs from
        "quantised" (None), or the entry would be keyed for another decoder."""
        import torch

        facts = {
            "checkpoint": fingerprint,
            "torch": torch.__version__,
            "recipe": recipe,
            "activations": activation_dtype,
            "head": head_dtype,
            "format": CACHE_FORMAT,
        }
        digest = hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:32]
        return cls(folder, digest)

    @property
    def tensors(self) -> Path:
        return self.folder / f"{self.key}.safetensors"

    @property
    def manifest(self) -> Path:
        return self.folder / f"{self.key}.json"

    def load(self, names: list[str]) -> dict[str, StoredLinear] | None:
        """{linear name: (int8 weight, scales, bias or None)}, or None on a miss."""
        if not self.manifest.is_file() or not self.tensors.is_file():
            return None
        try:
            expected = json.loads(self.manifest.read_text(encoding="utf-8"))
            size = self.tensors.stat().st_size
            if size != expected["size"] or _sha256(self.tensors) != expected["sha256"]:
                raise ValueError("size or checksum differs from the manifest")
            if sorted(expected["layers"]) != sorted(names):
                raise ValueError("the cached layers are not this decoder's")
            from safetensors.torch import load_file

            flat = load_file(str(self.tensors))
            return {
                name: (flat[f"{name}.q"], flat[f"{name}.s"], flat.get(f"{name}.b"))
                for name in names
            }
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            log.warning("decoder cache %s is damaged (%s): quantising again", self.tensors, exc)
            for path in (self.manifest, self.tensors):
                path.unlink(missing_ok=True)
            return None

    def save(self, layers: Mapping[str, Int8WeightOnlyLinear]) -> None:
        """Write atomically (tensors, then the manifest that vouches for them)."""
        from safetensors.torch import save_file

        flat: dict[str, torch.Tensor] = {}
        for name, layer in layers.items():
            flat[f"{name}.q"] = layer.weight_int8
            flat[f"{name}.s"] = layer.scales
            if layer.bias is not None:
                flat[f"{name}.b"] = layer.bias
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            tmp = self.tensors.with_suffix(f".tmp{os.getpid()}")
            save_file(flat, str(tmp))
            manifest = {
                "size": tmp.stat().st_size,
                "sha256": _sha256(tmp),
                "layers": sorted(layers),
            }
            os.replace(tmp, self.tensors)
            tmp_manifest = self.manifest.with_suffix(f".tmp{os.getpid()}")
            tmp_manifest.write_text(json.dumps(manifest), encoding="utf-8")
            os.replace(tmp_manifest, self.manifest)
        except OSError as exc:  # a read-only or full disk costs the next start time, no more
            log.warning("cannot write the decoder cache in %s: %s", self.folder, exc)
            for leftover in self.folder.glob(f"{self.key}.tmp*"):
                leftover.unlink(missing_ok=True)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()
