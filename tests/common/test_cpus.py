"""One CPU count for every engine (daemon/common/cpus.py)."""

from __future__ import annotations

import os

import psutil
import pytest

from daemon.common.cpus import resolve_threads, usable_cores


def test_configured_threads_win() -> None:
    assert resolve_threads(3) == 3
    assert resolve_threads(0) == usable_cores() >= 1


def test_affinity_mask_caps_the_physical_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    # taskset / CPUAffinity= / a cpuset: 8 physical cores, 2 allowed -> 2 threads.
    monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: 8)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert usable_cores() == 2
    # SMT: 4 logical CPUs allowed on 2 physical cores -> 2 threads.
    monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: 2)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert usable_cores() == 2


def test_without_affinity_support_physical_cores_count(monkeypatch: pytest.MonkeyPatch) -> None:
    def unsupported(pid: int) -> set[int]:
        raise OSError("not supported")

    monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: 6)
    monkeypatch.setattr(os, "sched_getaffinity", unsupported)
    assert usable_cores() == 6


# -- the SSE4.2-only class (Celeron J4125/J4025/N5105): no AVX at all ----------------------

# How the benches reproduce that class on a newer CPU: /proc/cpuinfo still shows AVX-512.
SSE42_CAPS = {
    "ATEN_CPU_CAPABILITY": "default",
    "ONEDNN_MAX_CPU_ISA": "SSE41",
    "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
}
ZEN4 = {"sse2", "sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_bf16"}


def test_auto_precision_on_the_sse42_class_emulates_no_bf16() -> None:
    from daemon.common.cpus import native_bf16
    from daemon.engines.mineru.runtimes.transformers_model import auto_precision

    celeron = {"sse2", "ssse3", "sse4_1", "sse4_2", "aes"}
    assert auto_precision(celeron, env={}) == "fp32"
    # Capped: the flags say Zen 4, torch's kernels say otherwise; the caps win.
    assert not native_bf16(ZEN4, env=SSE42_CAPS)
    assert auto_precision(ZEN4, env=SSE42_CAPS) == "fp32"
    assert auto_precision(ZEN4, env={"ATEN_CPU_CAPABILITY": "avx2"}) == "int8"
    assert auto_precision(ZEN4, env={}) == "bf16"
    # Not x86, or nothing known: not judged by x86 flags.
    assert auto_precision({"fp", "asimd", "asimddp"}, env={}) == "int8"
    assert auto_precision(set(), env={}) == "int8"


def test_auto_precision_follows_cpu_flags() -> None:
    from daemon.config.settings import LOSSY_PRECISIONS
    from daemon.engines.mineru.runtimes.transformers_model import auto_precision

    # bf16 (packed) where bf16 is native without AMX; the weight-only int8 decoder
    # elsewhere, bf16 vision on AMX, fp32 vision without native bf16.
    assert auto_precision({"avx2", "avx512_bf16"}, env={}) == "bf16"
    assert auto_precision({"avx2", "amx_bf16"}, env={}) == "bf16-int8"
    assert auto_precision({"avx2", "fma"}, env={}) == "int8"
    assert auto_precision(set(), env={}) == "int8"
    # torch capped below native bf16 emulates it: then int8, whatever the CPU has
    amx = {"avx2", "avx512_bf16", "amx_bf16"}
    assert auto_precision(amx, env={"ATEN_CPU_CAPABILITY": "avx2"}) == "int8"
    assert auto_precision(amx, env={"ONEDNN_MAX_CPU_ISA": "AVX2"}) == "int8"
    assert auto_precision(amx, env={"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}) == "bf16-int8"
    assert auto_precision(amx, env={"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}) == "bf16"
    for flags in ({"avx2"}, amx):
        assert auto_precision(flags, env={}) not in LOSSY_PRECISIONS


_LOAD_AND_PARSE = """
import json, sys
from PIL import Image
from daemon.config.settings import EngineConfig
from daemon.document.page import PageInput, PageOptions
from daemon.engines.registry import create_engine

engine = create_engine("mineru", EngineConfig(model=sys.argv[1], precision="auto"))
info = engine.load()
page = PageInput(Image.new("RGB", (850, 1100), "white"), 0, 1, 100)
result = engine.parse_page(page, PageOptions(max_new_tokens_layout=64), lambda *a: None)
engine.close()
print(json.dumps({"precision": info.precision, "vision": info.details["dtype_vision"],
                  "decoder": info.details["dtype_decoder"],
                  "blocks": [b.type for b in result.blocks]}))
"""


def test_the_worker_loads_and_parses_a_page_under_the_sse42_caps(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The tiny model's load and one page, in a process whose torch is capped to SSE4.2
    (the caps are read when torch loads, so only a fresh process shows them)."""
    import json
    import subprocess
    import sys

    from tests.conftest import REPO
    from tests.tinymodel import tiny_model_once

    model = tiny_model_once(tmp_path_factory.mktemp("tiny-sse42"))
    cache = tmp_path_factory.mktemp("cache")
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_CACHE_HOME": str(cache),
           "HF_HUB_OFFLINE": "1", **SSE42_CAPS}
    run = subprocess.run([sys.executable, "-c", _LOAD_AND_PARSE, str(model)], env=env,
                         capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    facts = json.loads(run.stdout.strip().splitlines()[-1])
    assert facts == {"precision": "fp32", "vision": "float32", "decoder": "float32",
                     "blocks": ["text"]}, facts
