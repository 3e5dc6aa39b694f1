"""The daemon process stays light: it never imports Pillow, numpy, torch or their kin.

Only the worker process holds pixels and models. The daemon reads page results, writes
the outbox and moves originals; if one of those paths started importing Pillow (the page
types used to live next to the engines) the daemon would carry it for its whole life, and
an import of torch would cost gigabytes. numpy came in quietly once, with a library the
store used for a schema check. Checked on a real daemon loop in a fresh interpreter that
takes one document through to the outbox and fails another, against the same HEAVY set
the layer test holds the import graph to.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, write_config
from tests.docgen import make_text_image
from tests.house.test_layers import HEAVY

pytestmark = pytest.mark.integration

# Runs the daemon's own loop (what `docinbox run` does, without the signal handlers) until
# both files are settled, stops it cleanly, then reports every module it imported.
DRIVER = """
import json, sys, time
from daemon.service.app import Daemon
from daemon.cli.main import load_or_exit

cfg = load_or_exit(sys.argv[1])  # as `docinbox run` loads it: checked, folders created
daemon = Daemon(cfg)
daemon.start(time.monotonic())
deadline = time.monotonic() + 180
try:
    while time.monotonic() < deadline:
        daemon.loop(time.monotonic())
        done = list(cfg.outbox.rglob("*.md")) and list(cfg.failed.rglob("*.error.json"))
        if done:
            break
        time.sleep(0.05)
    daemon.stop_requested = True
    while not daemon.supervisor.stopped and time.monotonic() < deadline:
        daemon.loop(time.monotonic())
        time.sleep(0.05)
finally:
    daemon.close()
print(json.dumps({"settled": bool(done), "modules": sorted(sys.modules)}))
"""


def test_daemon_loop_never_imports_anything_heavy(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    make_text_image(tmp_path / "inbox" / "memo.png", ["HELLO DOCINBOX", "light daemon"])
    (tmp_path / "inbox" / "broken.pdf").write_bytes(b"not a pdf at all")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, str(config)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["settled"], proc.stderr
    heavy = [m for m in report["modules"] if m.split(".")[0] in HEAVY]
    assert heavy == [], heavy
    # The modules this test is about were really loaded, so the check above means something.
    loaded = set(report["modules"])
    wanted = {"daemon.document.page", "daemon.output.publish", "daemon.supervisor.supervisor"}
    assert wanted <= loaded
