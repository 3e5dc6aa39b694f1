"""Single kernels behind the realistic page's figures: what each CPU class (or ISA cap) runs fast.

Shapes are MinerU2.5's (shape.json): the vision tower's layer over the 4,900-patch layout
image (hidden 1,280, MLP 5,120, 16 heads of 80), the decoder's layers (hidden 896, MLP 4,864)
and its 151,936-token output head. Random values: these are speeds, not numerics.

- `gemm`: one fp32 linear (4,900 x 1,280 -> 5,120) and one fp32 SDPA, GFLOP/s. Shows which
  ISA caps reach which library (MKL's fp32 GEMMs ignore ATen's and oneDNN's caps).
- `head`: the bf16 head over 1 / 8 / 16 rows: one bf16 GEMM, against the weight widened to
  fp32 in slices of 256 / 512 / 1,024 rows (int8_linear.KeptHead), and against an fp32 head.
- `vision`: one vision layer's linears, SDPA and QuickGELU, in bf16 and in fp32.
- `int8-gemm`: int8 x int8 -> int32 (`torch._int_mm`) against fp32, the vision linear's shape.
- `int8-vision`: each of the vision layer's four linears (qkv, proj, fc1, fc2) over 4,900
  and 1,000 rows: fp32 `F.linear` (with bias), the engine's fp32 tower linear (bf16-stored
  weight widened per call), the engine's W8A8 linear (int8_vision.Int8DynamicLinear:
  per-token quantisation, `torch._int_mm`, the rescale and the bias), the same with 2 % of
  the input channels in fp32 (w8a8-mixed), and `torch._int_mm` alone. Whether an int8
  tower can pay on this CPU at all.
- `int8-layers`: the decoder's 24 layers of int8 weights (cache-cold) over 1 / 4 / 8 / 16
  rows: torch's int8 kernel against dequantising to bf16 for a dense GEMM.
- `vision-attention`: one layer's attention (16 heads of 80 over the 4,900 patches), torch's
  SDPA against the query-chunked GEMMs of runtimes/vision_attention.py at 128 / 256 / 512 /
  1,024 query rows, bf16 (where native) and fp32: the wall clock on --threads (best of 5,
  the load average beside it) and one thread's CPU time (best of 3; other processes do not
  inflate it).

    python bench/bench_kernels.py [gemm head vision int8-gemm int8-layers]
    MKL_ENABLE_INSTRUCTIONS=AVX2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 \\
        python bench/bench_kernels.py
    ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 python bench/bench_kernels.py   # the Zen 4 class

Run it alone on the machine: it prints the CPU, the caps and the load average before and after.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PATCHES = 4_900  # the layout image: 70 x 70 patches
VISION_HIDDEN, VISION_MLP, VISION_HEADS = 1_280, 5_120, 16
HIDDEN, MLP, VOCAB, LAYERS = 896, 4_864, 151_936, 24
MODES = ("gemm", "head", "vision", "int8-gemm", "int8-vision", "int8-layers", "vision-attention")
VISION_LINEARS = (  # name, (out, in)
    ("qkv", (3 * VISION_HIDDEN, VISION_HIDDEN)),
    ("proj", (VISION_HIDDEN, VISION_HIDDEN)),
    ("fc1", (VISION_MLP, VISION_HIDDEN)),
    ("fc2", (VISION_HIDDEN, VISION_MLP)),
)
CHUNK_ROWS = (128, 256, 512, 1_024)


def ms(fn: Callable[[], object], repeat: int = 3, clock: Callable[[], float] = time.perf_counter
       ) -> float:  # fmt: skip
    """Best-of-`repeat` milliseconds of `fn` after one warm-up call."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        start = clock()
        fn()
        best = min(best, clock() - start)
    return best * 1000


def cpu_model() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.partition(":")[2].strip()
    return "?"


def gemm(torch: Any, F: Any) -> None:
    x = torch.randn(PATCHES, VISION_HIDDEN)
    w = torch.randn(VISION_MLP, VISION_HIDDEN)
    q = torch.randn(1, VISION_HEADS, PATCHES, VISION_HIDDEN // VISION_HEADS)
    linear = ms(lambda: F.linear(x, w))
    sdpa = ms(lambda: F.scaled_dot_product_attention(q, q, q))
    flops_linear = 2 * PATCHES * VISION_HIDDEN * VISION_MLP
    flops_sdpa = 4 * VISION_HEADS * PATCHES * PATCHES * (VISION_HIDDEN // VISION_HEADS)
    print("| fp32 linear GFLOP/s | fp32 SDPA ms (GFLOP/s) |\n|---|---|")
    print(f"| {flops_linear / linear / 1e6:.0f} | {sdpa:.0f} ({flops_sdpa / sdpa / 1e6:.0f}) |")


def head(torch: Any, F: Any) -> None:
    weight = torch.randn(VOCAB, HIDDEN).to(torch.bfloat16)
    wide = weight.float()

    def sliced(x: Any, size: int) -> Any:
        out = torch.empty(x.shape[0], VOCAB)
        for start in range(0, VOCAB, size):
            out[:, start : start + size] = F.linear(x, weight[start : start + size].float())
        return out

    def row(rows: int) -> list[float]:
        x = torch.randn(rows, HIDDEN)
        cells = [ms(lambda: F.linear(x.to(torch.bfloat16), weight))]
        cells += [ms(lambda size=size: sliced(x, size)) for size in (256, 512, 1024)]  # type: ignore[misc]
        return [*cells, ms(lambda: F.linear(x, wide))]

    print("| rows | bf16 GEMM | widened, 256 | 512 | 1,024 | fp32 head |")
    print("|---|---|---|---|---|---|")
    for rows in (1, 8, 16):
        print(f"| {rows} | " + " | ".join(f"{c:.1f} ms" for c in row(rows)) + " |")


def vision(torch: Any, F: Any) -> None:
    def layer(dtype: Any) -> tuple[float, float, float]:
        x = torch.randn(PATCHES, VISION_HIDDEN).to(dtype)
        hidden = torch.randn(PATCHES, VISION_MLP).to(dtype)
        shapes = [
            (3 * VISION_HIDDEN, VISION_HIDDEN),  # qkv
            (VISION_HIDDEN, VISION_HIDDEN),  # proj
            (VISION_MLP, VISION_HIDDEN),  # fc1
            (VISION_HIDDEN, VISION_MLP),  # fc2
        ]
        linears = 0.0
        for out, inp in shapes:
            w = torch.randn(out, inp).to(dtype)
            source = hidden if inp == VISION_MLP else x
            linears += ms(lambda w=w, source=source: F.linear(source, w))  # type: ignore[misc]
        q = torch.randn(1, VISION_HEADS, PATCHES, VISION_HIDDEN // VISION_HEADS).to(dtype)
        sdpa = ms(lambda: F.scaled_dot_product_attention(q, q, q))
        gelu = ms(lambda: hidden * torch.sigmoid(1.702 * hidden))
        return linears, sdpa, gelu

    print("| dtype | linears | SDPA | QuickGELU |\n|---|---|---|---|")
    for dtype in (torch.bfloat16, torch.float32):
        linears, sdpa, gelu = layer(dtype)
        name = str(dtype).removeprefix("torch.")
        print(f"| {name} | {linears:.0f} ms | {sdpa:.0f} ms | {gelu:.0f} ms |")


def int8_gemm(torch: Any, F: Any) -> None:
    a = torch.randint(-127, 128, (PATCHES, VISION_HIDDEN), dtype=torch.int8)
    b = torch.randint(-127, 128, (VISION_HIDDEN, VISION_MLP), dtype=torch.int8)
    x = torch.randn(PATCHES, VISION_HIDDEN)
    w = torch.randn(VISION_MLP, VISION_HIDDEN)
    ops = 2 * PATCHES * VISION_HIDDEN * VISION_MLP
    int8 = ms(lambda: torch._int_mm(a, b))
    fp32 = ms(lambda: F.linear(x, w))
    print("| int8 GOP/s | fp32 GFLOP/s |\n|---|---|")
    print(f"| {ops / int8 / 1e6:.0f} | {ops / fp32 / 1e6:.0f} |")


def int8_vision_cells(
    torch: Any, F: Any, rows: int, out: int, inp: int, repeat: int = 5
) -> list[float]:
    """Best-of-`repeat` ms: fp32 F.linear; the engine's fp32 tower linear (Bf16StoredLinear:
    bf16 weight widened per call); W8A8; W8A8 with 2 % of the input channels fp32
    (w8a8-mixed); _int_mm alone; torch's fbgemm dynamic int8 linear (per-channel weights)
    on rows first divided by their own max, so that its per-tensor activation scale acts
    per token, and multiplied back after (not the engine's: what another kernel offers)."""
    from daemon.engines.mineru.runtimes.int8_linear import Bf16StoredLinear
    from daemon.engines.mineru.runtimes.int8_vision import Int8DynamicLinear

    linear = torch.nn.Linear(inp, out)
    stored = Bf16StoredLinear(linear.weight.detach().bfloat16(), linear.bias.detach())
    int8 = Int8DynamicLinear.from_linear(linear)
    outliers = torch.randperm(inp)[: inp // 50]
    mixed = Int8DynamicLinear.from_linear(linear, outliers=outliers)
    dynamic = torch.ao.quantization.quantize_dynamic(
        torch.nn.Sequential(linear),
        {torch.nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig},
        dtype=torch.qint8,
    )[0]
    bias_free = torch.ao.quantization.quantize_dynamic(
        torch.nn.Sequential(torch.nn.Linear(inp, out, bias=False)),
        {torch.nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig},
        dtype=torch.qint8,
    )[0]
    x = torch.randn(rows, inp)
    q = torch.randint(-127, 128, (rows, inp), dtype=torch.int8)

    def fbgemm_per_token() -> object:
        peak = x.abs().amax(dim=1, keepdim=True)
        return bias_free(x / peak).mul_(peak).add_(linear.bias)

    with torch.inference_mode():
        return [
            ms(lambda: F.linear(x, linear.weight, linear.bias), repeat=repeat),
            ms(lambda: stored(x), repeat=repeat),
            ms(lambda: int8(x), repeat=repeat),
            ms(lambda: mixed(x), repeat=repeat),
            ms(lambda: torch._int_mm(q, int8.weight_t), repeat=repeat),
            ms(lambda: dynamic(x), repeat=repeat),
            ms(fbgemm_per_token, repeat=repeat),
        ]


def int8_vision(torch: Any, F: Any, rows_list: tuple[int, ...], repeat: int) -> None:
    print("| rows | linear | fp32 F.linear | fp32, bf16-stored (the engine's) | W8A8 "
          "| W8A8, 2 % fp32 | F.linear / W8A8 | _int_mm alone | fbgemm dynamic "
          "| fbgemm, rows normalised | F.linear / fbgemm normalised |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for rows in rows_list:
        totals = [0.0] * 7
        for name, (out, inp) in (*VISION_LINEARS, ("all four", (0, 0))):
            cells = int8_vision_cells(torch, F, rows, out, inp, repeat) if out else totals
            totals = [t + c for t, c in zip(totals, cells, strict=True)] if out else totals
            fp32, stored, w8a8, mixed, raw, dynamic, normalised = cells
            print(f"| {rows:,} | {name} | {fp32:.1f} ms | {stored:.1f} ms | {w8a8:.1f} ms "
                  f"| {mixed:.1f} ms | {fp32 / w8a8:.2f}x | {raw:.1f} ms | {dynamic:.1f} ms "
                  f"| {normalised:.1f} ms | {fp32 / normalised:.2f}x |", flush=True)  # fmt: skip


def int8_layers(torch: Any, F: Any) -> None:
    shapes = [(HIDDEN, HIDDEN), (128, HIDDEN), (128, HIDDEN), (HIDDEN, HIDDEN),
              (MLP, HIDDEN), (MLP, HIDDEN), (HIDDEN, MLP)]  # fmt: skip
    layers = [
        [(torch.randint(-127, 128, s, dtype=torch.int8), (torch.rand(s[0]) / 100).bfloat16())
         for s in shapes]
        for _ in range(LAYERS)
    ]  # fmt: skip

    def step(rows: int, dequantise: bool) -> Callable[[], None]:
        narrow = torch.randn(rows, HIDDEN).bfloat16()
        wide = torch.randn(rows, MLP).bfloat16()

        def run() -> None:
            for layer in layers:
                for q, s in layer:
                    x = wide if q.shape[1] == MLP else narrow
                    if dequantise:
                        F.linear(x, q.to(torch.bfloat16)) * s
                    else:
                        torch.ops.aten._weight_int8pack_mm(x, q, s)

        return run

    print("| rows | int8 kernel | dequantised to bf16 |\n|---|---|---|")
    for rows in (1, 4, 8, 16):
        kernel, dense = ms(step(rows, False)), ms(step(rows, True))
        print(f"| {rows} | {kernel:.1f} ms | {dense:.1f} ms |")


def vision_attention(torch: Any, F: Any) -> None:
    from daemon.common.cpus import native_bf16
    from daemon.engines.mineru.runtimes.vision_attention import query_chunked_attention

    head_dim = VISION_HIDDEN // VISION_HEADS
    threads = torch.get_num_threads()

    def timed(fn: Callable[[], object]) -> str:
        wall = ms(fn, repeat=5)
        load = os.getloadavg()[0]
        torch.set_num_threads(1)
        try:
            cpu = ms(fn, clock=time.thread_time)
        finally:
            torch.set_num_threads(threads)
        return f"{wall:.0f} ms (load {load:.2f}) | {cpu:.0f} ms"

    def one_dtype(dtype: Any) -> None:
        q, k, v = (torch.randn(VISION_HEADS, PATCHES, head_dim).to(dtype) for _ in range(3))
        name = str(dtype).removeprefix("torch.")
        sdpa = timed(lambda: F.scaled_dot_product_attention(q[None], k[None], v[None]))
        print(f"| {name} | SDPA | {sdpa} |", flush=True)
        for rows in CHUNK_ROWS:
            chunked = timed(lambda rows=rows: query_chunked_attention(  # type: ignore[misc]
                q, k, v, head_dim**-0.5, rows=rows))  # fmt: skip
            print(f"| {name} | chunked, {rows} rows | {chunked} |", flush=True)

    print("| dtype | kernel | wall, best of 5 (load) | one thread's CPU time |")
    print("|---|---|---|---|")
    # Where bf16 is emulated no precision runs a bf16 tower (auto_precision), and its
    # emulated GEMMs would take minutes here: fp32 only.
    for dtype in (torch.bfloat16, torch.float32) if native_bf16() else (torch.float32,):
        one_dtype(dtype)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # No `choices`: argparse (3.11) checks an empty list against them and fails.
    parser.add_argument("modes", nargs="*", help=f"of {', '.join(MODES)} (default: all)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--int8-rows", default=f"{PATCHES},1000", help="int8-vision: rows")
    parser.add_argument("--int8-repeat", type=int, default=5, help="int8-vision: best of")
    args = parser.parse_args()
    if unknown := set(args.modes) - set(MODES):
        parser.error(f"unknown mode(s): {', '.join(sorted(unknown))}")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import torch
    import torch.nn.functional as F

    from daemon.engines.mineru.runtimes.transformers_model import isa_caps

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(
        f"{cpu_model()}, torch {torch.__version__} kernels "
        f"{torch.backends.cpu.get_cpu_capability()} {isa_caps() or ''}, {args.threads} "
        f"thread(s), load {os.getloadavg()[0]:.2f}"
    )
    runs = {"gemm": gemm, "head": head, "vision": vision, "int8-gemm": int8_gemm,
            "int8-vision": lambda torch, F: int8_vision(
                torch, F, tuple(int(r) for r in args.int8_rows.split(",")), args.int8_repeat),
            "int8-layers": int8_layers,
            "vision-attention": vision_attention}  # fmt: skip
    for mode in args.modes or MODES:
        print(f"\n{mode}")
        runs[mode](torch, F)
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
