"""bench/realscans/ keeps its provenance: every page has a transcription and a manifest row
whose size and sha256 match the file, and every row names a licence and a commit. Pages that
are fetched rather than kept (FETCH.tsv: make.py copies them into fetched/, which git
ignores) have a row too, with the reason they are not kept, and are checked when present.

A page whose origin cannot be traced is a page nobody may keep; the bench reads whatever is
in images/, so an unlisted file would enter the "real scans" figures unnoticed.
"""

from __future__ import annotations

import hashlib

import pytest

from tests.conftest import REPO

REALSCANS = REPO / "bench" / "realscans"


def manifest(name: str = "MANIFEST.tsv") -> dict[str, dict[str, str]]:
    lines = (REALSCANS / name).read_text(encoding="utf-8").splitlines()
    header = lines[0].split("\t")
    rows = [dict(zip(header, line.split("\t"), strict=True)) for line in lines[1:] if line]
    return {row["local_name"]: row for row in rows}


@pytest.mark.skipif(not REALSCANS.is_dir(), reason="no bench/realscans in this checkout")
def test_every_real_scan_is_listed_with_its_transcription() -> None:
    rows = manifest()
    images = sorted(p.name for p in (REALSCANS / "images").iterdir())
    assert images == sorted(rows), "images/ and MANIFEST.tsv list different files"
    for name, row in rows.items():
        data = (REALSCANS / "images" / name).read_bytes()
        assert int(row["bytes"]) == len(data), name
        assert row["sha256"] == hashlib.sha256(data).hexdigest(), name
        assert len(row["commit"]) == 40 and row["licence"] and row["source_repo"], name
        truth = REALSCANS / "truth" / f"{name.rsplit('.', 1)[0]}.txt"
        assert truth.read_text(encoding="utf-8").strip(), f"{name}: empty transcription"


@pytest.mark.skipif(not REALSCANS.is_dir(), reason="no bench/realscans in this checkout")
def test_every_fetched_page_is_listed_and_every_transcription_has_a_page() -> None:
    kept, fetched = manifest(), manifest("FETCH.tsv")
    assert not set(kept) & set(fetched), "a page is both kept and fetched"
    for name, row in fetched.items():
        assert len(row["commit"]) == 40 and row["licence"] and row["why_not_kept"], name
        image = REALSCANS / "fetched" / name
        if image.is_file():  # the bench reads it: it must be the file the row names
            assert row["sha256"] == hashlib.sha256(image.read_bytes()).hexdigest(), name
    stems = {n.rsplit(".", 1)[0] for n in [*kept, *fetched]}
    truths = {p.stem for p in (REALSCANS / "truth").glob("*.txt")}
    assert truths == stems, "truth/ and the two lists name different pages"
