"""End to end: the real `docinbox run` process on temp folders, real files, real outputs.

These use the `lite` engine (PDF text layer + RapidOCR, fully offline) so the text in the
Markdown can be checked; the MinerU engine has its own end-to-end test with a tiny model.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.conftest import DaemonFactory, drop, wait_for
from tests.docgen import (
    make_bomb_png,
    make_encrypted_pdf,
    make_text_image,
    make_text_pdf,
    make_truncated,
)

pytestmark = pytest.mark.integration


def test_text_pdf_and_image_become_markdown_and_duplicates_are_skipped(
    tmp_path: Path, daemon_factory: DaemonFactory
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    pdf = make_text_pdf(src / "invoice.pdf", [["# Quarterly Invoice", "Total amount due 4711 EUR"],
                                              ["Second page mentions zebra crossings"]])
    png = make_text_image(src / "note.png", ["HELLO DOCINBOX", "scanned memo"])
    d = daemon_factory().start()
    inbox = tmp_path / "inbox"
    drop(pdf, inbox)
    drop(png, inbox)
    (inbox / "sub").mkdir()
    drop(pdf, inbox / "sub", "same content other name.pdf")
    jobs = d.wait_settled(3)
    states = sorted(j["state"] for j in jobs)
    assert states == ["done", "done", "duplicate"], d.output()

    md = (tmp_path / "outbox" / "invoice" / "invoice.md").read_text()
    assert "Quarterly Invoice" in md and "4711" in md and "zebra" in md
    assert md.lstrip().startswith("#")  # the big first line became a heading
    out = tmp_path / "outbox" / "invoice"
    content = json.loads((out / "invoice_content_list.json").read_text())
    assert {c["page_idx"] for c in content} == {0, 1}
    assert all(len(c["bbox"]) == 4 for c in content)
    meta = json.loads((tmp_path / "outbox" / "invoice" / "invoice.meta.json").read_text())
    assert meta["page_count"] == 2 and meta["engine"]["name"] == "lite"
    assert len(meta["sha256"]) == 64 and len(meta["seconds_per_page"]) == 2
    # meta says, block by block in content_list order, where each came from: the PDF's own
    # text layer for this born-digital file
    per_block = [b for page in meta["pages"] for b in page["blocks"]]
    assert [b["bbox"] for b in per_block] == [c["bbox"] for c in content]
    assert {b["source"] for b in per_block} == {"text_layer"}
    assert meta["block_sources"] == {"text_layer": len(content)}

    note = (tmp_path / "outbox" / "note" / "note.md").read_text().upper()
    assert "HELLO" in note and "DOCINBOX" in note

    # originals archived, the duplicate moved aside, nothing left in the inbox
    assert (tmp_path / "archive" / "invoice.pdf").exists()
    assert (tmp_path / "duplicates" / "sub" / "same content other name.pdf").exists()
    assert [p for p in inbox.rglob("*") if p.is_file()] == []
    # exactly two outputs: the duplicate cost no model time and wrote nothing
    assert len(d.outputs()) == 2
    assert d.stop() == 0


def test_bad_inputs_fail_with_reasons_and_the_daemon_keeps_going(
    tmp_path: Path, daemon_factory: DaemonFactory
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    good = make_text_pdf(src / "good.pdf", [["A perfectly good document"]])
    bad = {
        "corrupt.pdf": b"%PDF-1.7\n" + os.urandom(2000),
        "empty.pdf": b"",
        "notapdf.pdf": b"PK\x03\x04 this is really a zip file",
    }
    for name, data in bad.items():
        (src / name).write_bytes(data)
    make_truncated(src / "truncated.pdf", make_text_pdf(src / "full.pdf", [["x"] * 40] * 3))
    make_encrypted_pdf(src / "locked.pdf", "s3cret")
    make_bomb_png(src / "bomb.png", 400_000_000)
    d = daemon_factory(limits={"max_image_pixels": 50_000_000}).start()
    inbox = tmp_path / "inbox"
    for name in [*bad, "truncated.pdf", "locked.pdf", "bomb.png"]:
        drop(src / name, inbox)
    drop(good, inbox)
    jobs = d.wait_settled(7)
    by_name = {Path(j["source_path"]).name: j for j in jobs}
    assert by_name["good.pdf"]["state"] == "done", d.output()
    expected = {
        "corrupt.pdf": "corrupt",
        "empty.pdf": "empty",
        "notapdf.pdf": "unsupported",
        "truncated.pdf": "corrupt",
        "locked.pdf": "encrypted",
        "bomb.png": "decompression_bomb",
    }
    for name, kind in expected.items():
        job = by_name[name]
        assert job["state"] == "failed", (name, job)
        assert job["error_kind"] == kind, (name, job["error_kind"], job["error"])
        moved = tmp_path / "failed" / name
        assert moved.exists(), name
        err = json.loads((tmp_path / "failed" / f"{name}.error.json").read_text())
        assert err["kind"] == kind and err["reason"] and err["hint"]
    assert "no matching password" in by_name["locked.pdf"]["error"]
    assert d.proc is not None and d.proc.poll() is None  # still up
    assert d.stop() == 0


def test_encrypted_pdf_opens_with_a_configured_password_never_logged(
    tmp_path: Path, daemon_factory: DaemonFactory
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    make_encrypted_pdf(src / "locked.pdf", "s3cret-pw", pages=[["Confidential payroll"]])
    d = daemon_factory(passwords=["wrong", "s3cret-pw"]).start()
    drop(src / "locked.pdf", tmp_path / "inbox")
    jobs = d.wait_settled(1)
    assert jobs[0]["state"] == "done", d.output()
    assert "payroll" in (tmp_path / "outbox" / "locked" / "locked.md").read_text()
    d.stop()
    assert "s3cret-pw" not in d.output()


def test_slow_writer_is_taken_once_and_only_when_complete(
    tmp_path: Path, daemon_factory: DaemonFactory
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    pdf = make_text_pdf(src / "slow.pdf", [["Written slowly, chunk by chunk"]] * 3)
    data = pdf.read_bytes()
    d = daemon_factory(stability_seconds=2).start()
    target = tmp_path / "inbox" / "slow.pdf"
    # Appends with pauses shorter than stability_seconds, for several seconds in all.
    with open(target, "wb") as f:
        step = max(1, len(data) // 6)
        for i in range(0, len(data), step):
            f.write(data[i : i + step])
            f.flush()
            time.sleep(0.8)
    jobs = d.wait_settled(1)
    assert len(jobs) == 1 and jobs[0]["state"] == "done", (jobs, d.output())
    assert "chunk by chunk" in d.outputs()[0].read_text()
    d.stop()


def test_kill_9_mid_document_then_restart_completes_once(
    tmp_path: Path, daemon_factory: DaemonFactory
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    pdf = make_text_pdf(src / "long.pdf", [[f"Page number {i} of the long one"] for i in range(6)])
    engine = {"name": "tests.plugins:FaultEngine", "options": {"fault": "slow",
                                                                "slow_seconds": 1.5}}
    d = daemon_factory(engine=engine).start()
    drop(pdf, tmp_path / "inbox")
    wait_for(lambda: any(j["pages_done"] >= 2 for j in d.jobs()), 120, "two pages", d.proc)
    d.kill9()
    assert d.jobs()[0]["state"] == "running"
    d2 = daemon_factory()
    d2.config = d.config  # same config, same folders
    d2.start()
    jobs = d2.wait_settled(1)
    assert [j["state"] for j in jobs] == ["done"], d2.output()
    assert "resuming at page" in d2.output()
    md = d2.outputs()
    assert len(md) == 1
    text = md[0].read_text()
    for i in range(6):
        assert text.count(f"Page number {i} ") == 1
    assert not list((tmp_path / "outbox").glob(".docinbox-tmp/*"))
    assert d2.stop() == 0


def test_worker_killed_mid_page_is_restarted_and_document_completes(
    tmp_path: Path, daemon_factory: DaemonFactory
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    pdf = make_text_pdf(src / "doc.pdf", [["First page text"], ["Second page text"]])
    engine = {"name": "tests.plugins:FaultEngine", "options": {"fault": "slow",
                                                                "slow_seconds": 3}}
    d = daemon_factory(engine=engine).start()
    drop(pdf, tmp_path / "inbox")

    def worker_pid() -> int | None:
        rt = d.runtime()
        cur = rt.get("current") or {}
        return rt.get("worker_pid") if rt.get("phase") == "busy" and cur.get("page") else None

    pid = wait_for(worker_pid, 120, "the worker to be busy", d.proc)
    os.kill(pid, signal.SIGKILL)
    jobs = d.wait_settled(1)
    assert jobs[0]["state"] == "done", d.output()
    assert jobs[0]["crashes"] == 1
    assert "SIGKILL" in d.output()
    assert "Second page text" in d.outputs()[0].read_text()
    d.stop()


def test_a_document_that_keeps_crashing_the_worker_is_failed(
    tmp_path: Path, daemon_factory: DaemonFactory
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    marker = tmp_path / "marker"
    marker.mkdir()
    make_text_pdf(src / "poison.pdf", [["poison"]])
    make_text_pdf(src / "fine.pdf", [["fine afterwards"]])
    engine = {"name": "tests.plugins:FaultEngine",
              "options": {"fault": "segfault", "times": 3, "marker_dir": str(marker)}}
    d = daemon_factory(engine=engine, worker={"max_attempts": 3,
                                              "restart_backoff_seconds": 0.2}).start()
    drop(src / "poison.pdf", tmp_path / "inbox")
    jobs = d.wait_settled(1)
    assert jobs[0]["state"] == "failed" and jobs[0]["error_kind"] == "crashed", jobs
    assert "SIGSEGV" in jobs[0]["error"]
    drop(src / "fine.pdf", tmp_path / "inbox")
    jobs = d.wait_settled(2)
    assert jobs[1]["state"] == "done"
    d.stop()


def test_sigterm_mid_document_stops_cleanly_and_resumes(
    tmp_path: Path, daemon_factory: DaemonFactory
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    pdf = make_text_pdf(src / "doc.pdf", [[f"Section {i}"] for i in range(4)])
    engine = {"name": "tests.plugins:FaultEngine", "options": {"fault": "slow",
                                                                "slow_seconds": 1.5}}
    d = daemon_factory(engine=engine).start()
    drop(pdf, tmp_path / "inbox")
    wait_for(lambda: any(j["pages_done"] >= 1 for j in d.jobs()), 120, "a page", d.proc)
    assert d.stop(signal.SIGTERM) == 0
    jobs = d.jobs()
    assert jobs[0]["state"] == "queued" and 1 <= jobs[0]["pages_done"] < 4
    d2 = daemon_factory()
    d2.config = d.config
    d2.start()
    assert d2.wait_settled(1)[0]["state"] == "done"
    d2.stop()


def test_hostile_file_names_are_safe_in_outputs_and_logs(
    tmp_path: Path, daemon_factory: DaemonFactory
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    d = daemon_factory().start()
    inbox = tmp_path / "inbox"
    evil = "evil\nINFO forged line $(touch pwned) ..pdf"
    make_text_pdf(src / "a.pdf", [["Hostile name content"]])
    drop(src / "a.pdf", inbox, evil)
    # a name that is not UTF-8 (latin-1 bytes from an old share)
    raw = os.fsencode(str(inbox)) + b"/caf\xe9 menu.pdf"
    with open(raw, "wb") as f:
        f.write(make_text_pdf(src / "b.pdf", [["Latin one name"]]).read_bytes())
    jobs = d.wait_settled(2)
    states = sorted(j["state"] for j in jobs)
    assert states == ["done", "failed"], (jobs, d.output())
    out = d.outputs()
    assert len(out) == 1 and "\n" not in out[0].parent.name
    assert out[0].parent.parent == tmp_path / "outbox"  # no escape through '..'
    assert "Hostile name content" in out[0].read_text()
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "src" / "pwned").exists()
    log = d.output()
    assert "\nINFO forged line" not in log
    failed = next(j for j in jobs if j["state"] == "failed")
    assert "not valid UTF-8" in failed["error"]
    assert os.path.exists(os.fsencode(str(tmp_path / "failed")) + b"/caf\xe9 menu.pdf")
    d.stop()
