"""Command line: `docinbox run|parse|status|list|retry|reprocess|check-config|model|hooks`.

Exit codes (daemon.common.errors.ExitCode): 0 ok; 1 a document failed (`parse`); 2 usage;
3 no such job; 4 engine unavailable and no fallback; 5 already running; 78 bad config;
130 interrupted.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import ipaddress
import json
import logging
import logging.handlers
import os
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from daemon import __version__
from daemon.cli.status_view import render_status
from daemon.common.display import safe_display
from daemon.common.errors import ExitCode
from daemon.common.units import age
from daemon.config.settings import (
    LOSSY_PRECISIONS,
    Config,
    ConfigError,
    EngineConfig,
    check_paths,
    load_config,
    parse_page_range,
    redacted_dict,
    resolve_config_path,
)
from daemon.config.values import is_loopback
from daemon.jobs.states import JobState
from daemon.jobs.store import Job, Store, StoreBusy
from daemon.service.status import collect

log = logging.getLogger("docinbox")


def setup_logging(cfg: Config | None, verbose: bool = False) -> None:
    level = "DEBUG" if verbose else (cfg.logging.level if cfg else "INFO")
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if cfg is not None and cfg.logging.file is not None:
        cfg.logging.file.parent.mkdir(parents=True, exist_ok=True)
        # The log names every file (and reasons for failures): the service user's only,
        # whatever the umask. Created here with 0600; an existing file keeps its mode.
        os.close(os.open(cfg.logging.file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
        # Watched: a file renamed away by logrotate is followed by a new one at the next
        # record, so no `copytruncate` is needed (docs/systemd.md).
        handlers = [logging.handlers.WatchedFileHandler(cfg.logging.file, encoding="utf-8")]
    fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    if cfg is not None and cfg.logging.json:
        fmt = (
            '{"time": "%(asctime)s", "level": "%(levelname)s", "logger": "%(name)s", '
            '"message": %(message_json)s}'
        )
        for h in handlers:
            h.addFilter(_json_message)
    if os.environ.get("JOURNAL_STREAM") and cfg is not None and not cfg.logging.json:
        fmt = "%(levelname)s %(name)s: %(message)s"  # journald adds its own timestamps
    logging.basicConfig(level=level, handlers=handlers, format=fmt, force=True)


def _json_message(record: logging.LogRecord) -> bool:
    record.message_json = json.dumps(record.getMessage())
    return True


def load_or_exit(arg: str | None, *, check: bool = True, away_ok: bool = False) -> Config:
    """The configuration, or exit 78 with every problem. `away_ok` (`docinbox run`): an
    inbox that is only missing and that the state database has seen before is a share
    away at the wrong moment, which the daemon waits for, not a problem; exiting for it
    would stop the service for good (systemd does not restart 78)."""
    path = resolve_config_path(arg)
    try:
        cfg = load_config(path)
        if check:
            problems = check_paths(cfg, create=True)
            if away_ok and any(p.away is not None for p in problems):
                seen = seen_inboxes(cfg)
                problems = [p for p in problems if p.away is None or p.away not in seen]
            if problems:
                raise ConfigError(problems)
    except ConfigError as exc:
        print(f"docinbox: configuration problems in {path}:", file=sys.stderr)
        for p in exc.problems:
            print(f"  - {p}", file=sys.stderr)
        raise SystemExit(ExitCode.CONFIG) from None
    return cfg


def seen_inboxes(cfg: Config) -> set[str]:
    """The inboxes the state database has seen; none when there is no database yet or
    it cannot be read (a missing inbox is then refused, as a typo would be)."""
    if not cfg.db_path.exists():
        return set()
    try:
        store = Store.of(cfg, readonly=True)
    except (sqlite3.Error, StoreBusy):
        return set()
    try:
        return store.seen_inboxes()
    except sqlite3.Error:
        return set()
    finally:
        store.close()


# -- commands ---------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    from daemon.service.app import Daemon

    # An inbox seen before but missing now starts as away: the watcher says so once,
    # status and /healthz show it, and it is watched from the moment it appears.
    cfg = load_or_exit(args.config, away_ok=True)
    setup_logging(cfg, args.verbose)
    return Daemon(cfg).run()


def cmd_check_config(args: argparse.Namespace) -> int:
    cfg = load_or_exit(args.config)
    if args.systemd:
        print(systemd_paths_dropin(cfg), end="")
        return ExitCode.OK
    print(f"{cfg.source}: OK")
    if cfg.engine.name == "mineru" and cfg.engine.precision in LOSSY_PRECISIONS:
        print(
            f"warning: engine.precision {cfg.engine.precision} is lossy (its dynamic int8 decoder "
            "fails the fidelity gate against fp32 on real trained decoders: README, "
            "Precision); auto, fp32, bf16, mixed, int8 and bf16-int8 pass it"
        )
    for line in estimate_line(cfg).splitlines():
        # --show's output stays YAML (scripts read it): the estimate as a comment there.
        print(f"# {line}" if args.show else line)
    if args.show:
        print(yaml.safe_dump(redacted_dict(cfg), sort_keys=False, allow_unicode=True))
    return ExitCode.OK


def estimate_line(cfg: Config) -> str:
    """The page estimate as the last worker start left it in the state folder; never
    timed here (that needs the model loaded: seconds and gigabytes, maybe beside a running
    daemon's own copy)."""
    from daemon.common.estimate import EstimateCache, cached

    estimate = cached(cfg.engine, EstimateCache.in_state_dir(cfg), missing_weights(cfg))
    line = f"page estimate ({cfg.engine.name}): {estimate.describe()}"
    warning = estimate.warning()
    return f"{line}\nwarning: {warning}" if warning else line


def missing_weights(cfg: Config) -> str | None:
    """Why the worker could not load MinerU's weights now (a local lookup, as the worker's:
    no download, no torch import), or None when they are there or not needed."""
    engine = cfg.engine
    if engine.name != "mineru" or engine.runtime != "transformers":
        return None
    from daemon.common.errors import EngineUnavailable
    from daemon.engines.mineru.runtimes.transformers_model import resolve_weights

    try:
        resolve_weights(engine.model, engine.revision)
    except EngineUnavailable as exc:
        return f"{exc.message} (`{exc.hint}`)" if exc.hint else exc.message
    return None


# The unit's StateDirectory: writable inside the sandbox without being listed.
SYSTEMD_STATE_DIRECTORY = Path("/var/lib/docinbox")


def systemd_paths_dropin(cfg: Config) -> str:
    """A drop-in for docinbox.service granting write access to exactly the folders of
    `cfg` (ProtectSystem=strict makes everything else read-only).

    Inboxes are listed too: originals are moved or deleted from them. A leading "-" lets
    the unit start while a share is not mounted yet; docinbox then names the missing
    folder itself.
    """
    folders = [i.path for i in cfg.inboxes]
    folders += [cfg.outbox, cfg.archive, cfg.failed, cfg.duplicates, cfg.state_dir]
    if cfg.logging.file is not None:
        folders.append(cfg.logging.file.parent)
    lines = [
        f"# docinbox check-config --systemd --config {cfg.source}",
        "# Save as /etc/systemd/system/docinbox.service.d/paths.conf, then",
        "# systemctl daemon-reload && systemctl restart docinbox",
        "[Service]",
    ]
    seen: set[Path] = set()
    for folder in folders:
        folder = folder.resolve()
        if folder in seen or folder.is_relative_to(SYSTEMD_STATE_DIRECTORY):
            continue
        seen.add(folder)
        text = str(folder)
        if any(c in text for c in ' "\\\'\n\t'):
            # systemd unquotes C-style: a quoted word keeps its spaces.
            text = '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
        lines.append(f"ReadWritePaths=-{text}")
    if len(lines) == 4:
        lines.append("# every folder is under /var/lib/docinbox (StateDirectory): nothing to add")
    lines += _hook_addresses(cfg)
    return "\n".join(lines) + "\n"


def _hook_addresses(cfg: Config) -> list[str]:
    """The unit admits only loopback traffic (IPAddressAllow=localhost): each webhook on
    another machine needs its address let through. systemd takes addresses, not names."""
    out: list[str] = []
    for i, hook in enumerate(cfg.hooks.webhooks):
        host = urlsplit(hook.url).hostname or ""
        if is_loopback(host):
            continue
        try:
            out.append(f"IPAddressAllow={ipaddress.ip_address(host)}")
        except ValueError:
            out.append(f"# hooks.webhooks[{i}] ({hook.receiver}): systemd allows addresses, not "
                       f"names: add IPAddressAllow=<the address or network of {host}>")
    if cfg.hooks.commands:
        out.append("# hooks.commands run inside this unit: a command that talks to another "
                   "machine needs its IPAddressAllow= too")
    return out


def _open_store(cfg: Config) -> Store:
    if not cfg.db_path.exists():
        print(
            f"docinbox: no database yet at {cfg.db_path} (has `docinbox run` started?)",
            file=sys.stderr,
        )
        raise SystemExit(ExitCode.NOT_FOUND)
    return Store.of(cfg, readonly=True)


def cmd_status(args: argparse.Namespace) -> int:
    cfg = load_or_exit(args.config, check=False)
    store = _open_store(cfg)
    try:
        st = collect(cfg, now=time.time(), store=store)
    finally:
        store.close()
    if args.json:
        print(json.dumps(st.to_json(), indent=2, default=str))
        return ExitCode.OK
    print(render_status(st))
    return ExitCode.OK


def _job_dict(j: Job) -> dict[str, Any]:
    d = dataclasses.asdict(j)
    d["state"] = j.state.value
    return d


def cmd_list(args: argparse.Namespace) -> int:
    cfg = load_or_exit(args.config, check=False)
    store = _open_store(cfg)
    state = JobState(args.state) if args.state else None
    jobs = store.jobs(state, limit=args.limit)
    if args.json:
        print(json.dumps([_job_dict(j) for j in jobs], indent=2, default=str))
        return ExitCode.OK
    for j in jobs:
        when = dt.datetime.fromtimestamp(j.created_at).strftime("%Y-%m-%d %H:%M")
        extra = ""
        if j.state == JobState.FAILED:
            extra = f"  {j.error_kind}: {j.error}"
        elif j.state == JobState.DUPLICATE:
            extra = f"  duplicate of job {j.duplicate_of}"
        elif j.state == JobState.DONE:
            extra = f"  -> {j.output_dir}"
        elif j.page_count:
            extra = f"  {j.pages_done}/{j.page_count} pages"
        name = safe_display(Path(j.source_path).name)
        print(f"{j.id:>6}  {j.state.value:<9} {when}  {name}{extra}")
    return ExitCode.OK


def cmd_retry(args: argparse.Namespace) -> int:
    cfg = load_or_exit(args.config, check=False)
    store = Store.of(cfg)
    ids = [j.id for j in store.jobs(JobState.FAILED, limit=100000)] if args.failed else [args.id]
    return _requeue(store, ids, JobState.FAILED, store.retry, "retry")


def cmd_reprocess(args: argparse.Namespace) -> int:
    cfg = load_or_exit(args.config, check=False)
    store = Store.of(cfg)
    ids = [j.id for j in store.jobs(JobState.DONE, limit=100000)] if args.all else [args.id]
    return _requeue(store, ids, JobState.DONE, store.reprocess, "reprocess")


def _requeue(store: Store, ids: list[int | None], want: JobState, fn: Any, verb: str) -> int:
    if not ids:
        print(f"docinbox: no {want.value} jobs to {verb}", file=sys.stderr)
        return ExitCode.NOT_FOUND
    code = ExitCode.OK
    for job_id in ids:
        job = store.job(int(job_id)) if job_id is not None else None
        if job is None:
            print(f"docinbox: no job {job_id}", file=sys.stderr)
            code = ExitCode.NOT_FOUND
            continue
        if job.state != want:
            print(
                f"docinbox: job {job.id} is {job.state.value}; only {want.value} jobs can be "
                f"{verb}ed",
                file=sys.stderr,
            )
            code = ExitCode.NOT_FOUND
            continue
        if not Path(job.read_path).exists():
            print(
                f"docinbox: job {job.id}: the original is no longer at {job.read_path} "
                "(deleted after success?); drop the file into the inbox again",
                file=sys.stderr,
            )
            code = ExitCode.NOT_FOUND
            continue
        fn(job.id, time.time())
        print(f"job {job.id} queued again ({Path(job.source_path).name})")
    return code


def cmd_hooks(args: argparse.Namespace) -> int:
    """`docinbox hooks [list|retry|test]`."""
    action = args.hooks_cmd or "list"
    cfg = load_or_exit(args.config, check=False)
    if action == "test":
        return _hooks_test(cfg, getattr(args, "name", None))
    if action == "retry":
        store = Store.of(cfg)
        try:
            for name in store.enable_receivers():  # 410 Gone: the user says try again
                print(f"hook {name}: enabled again (it had answered 410 Gone)")
            if args.dead:
                n = store.requeue_deliveries(time.time())
                if not n:
                    print("docinbox: no given-up deliveries to retry", file=sys.stderr)
                    return ExitCode.NOT_FOUND
                print(f"{n} delivery(ies) queued again")
                return ExitCode.OK
            found = store.event(str(args.id))
            if found is None:
                print(f"docinbox: no event {args.id}", file=sys.stderr)
                return ExitCode.NOT_FOUND
            n = store.requeue_deliveries(time.time(), found[0])
            if not n:
                print(f"docinbox: event {found[1]} was delivered to every hook already",
                      file=sys.stderr)
                return ExitCode.NOT_FOUND
            print(f"event {found[1]}: {n} delivery(ies) queued again")
            return ExitCode.OK
        finally:
            store.close()
    store = _open_store(cfg)
    try:
        rows = store.deliveries(("pending", "dead"), limit=args.limit)
    finally:
        store.close()
    if args.json:
        print(json.dumps([
            {k: v for k, v in dataclasses.asdict(d).items() if k != "body"} for d in rows
        ], indent=2))
        return ExitCode.OK
    if not rows:
        print("no events waiting or given up")
    for d in rows:
        when = dt.datetime.fromtimestamp(d.created_at).strftime("%Y-%m-%d %H:%M:%S")
        line = (f"{d.seq:>6}  {d.state:<7} {when}  {d.receiver}  {d.type} job {d.job_id}  "
                f"{d.event_id}  {d.attempts} attempt(s)")
        if d.state == "pending" and d.attempts:
            line += f", next in {age(max(0.0, d.next_at - time.time()))}"
        if d.last_error:
            line += f"  last error: {d.last_error}"
        print(line)
    return ExitCode.OK


def cmd_vacuum(args: argparse.Namespace) -> int:
    """`docinbox vacuum`: prune what hooks.retention_days allows, rebuild the file small."""
    cfg = load_or_exit(args.config, check=False)
    _open_store(cfg).close()  # says so when there is no database yet
    sizes = [cfg.db_path, cfg.db_path.with_name(cfg.db_path.name + "-wal")]
    before = sum(p.stat().st_size for p in sizes if p.exists())
    store = Store.of(cfg)
    try:
        now = time.time()
        store.prune_deliveries(now - cfg.hooks.retention_days * 86400.0)
        store.prune_page_times(now)
        store.vacuum()
    except StoreBusy as exc:
        print(f"docinbox: the database cannot be compacted now: {exc}", file=sys.stderr)
        return 1
    finally:
        store.close()
    after = sum(p.stat().st_size for p in sizes if p.exists())
    print(f"{cfg.db_path}: {before:,} bytes -> {after:,} bytes")
    return ExitCode.OK


def _hooks_test(cfg: Config, only: str | None) -> int:
    """Send a test event to each hook (or the one named) now, and say what came back."""
    from daemon.output.events import new_event_id, probe_event
    from daemon.service.hooks import senders_for

    senders = [s for s in senders_for(cfg) if only is None or s.name == only]
    if not senders:
        print("docinbox: no such hook configured" if only else
              "docinbox: no hooks configured (hooks.webhooks, hooks.commands)", file=sys.stderr)
        return ExitCode.NOT_FOUND
    code = ExitCode.OK
    for sender in senders:
        event_id = new_event_id()
        body = json.dumps(probe_event(time.time(), event_id), separators=(",", ":"))
        try:
            attempt = sender.send(event_id, body)
        finally:
            sender.close()
        print(f"{sender.name}: {'ok' if attempt.ok else 'FAILED'}: {attempt.message}")
        if not attempt.ok:
            code = ExitCode.FAILED_DOCUMENTS
    return code


def cmd_parse(args: argparse.Namespace) -> int:
    from daemon.cli.parse import parse_files

    path = resolve_config_path(args.config)
    base = load_or_exit(args.config, check=False) if path.exists() else None
    setup_logging(base, args.verbose)
    if args.pages:
        try:
            parse_page_range(args.pages, 10**6)
        except ValueError:
            print(f"docinbox: --pages {args.pages!r}: use 1-based pages like 1-3,7 or 2-",
                  file=sys.stderr)
            return ExitCode.USAGE
    return parse_files(
        [Path(f) for f in args.files], Path(args.output), base, engine=args.engine,
        pages=args.pages,
    )


def cmd_model(args: argparse.Namespace) -> int:
    from daemon.cli import model
    from daemon.engines.mineru.runtimes.transformers_model import DEFAULT_MODEL, looks_like_path

    path = resolve_config_path(args.config)
    cfg = load_or_exit(args.config, check=False) if path.exists() else None
    model_id = args.model or (cfg.engine.model if cfg else DEFAULT_MODEL)
    revision = args.revision or (cfg.engine.revision if cfg else None)
    engine = dataclasses.replace(
        cfg.engine if cfg else EngineConfig(),
        **({"runtime": args.runtime} if args.runtime else {}),
    )
    try:
        if engine.runtime != "transformers":
            return _model_runtime(args, engine, model_id)
        if args.model_cmd == "pull":
            where = model.pull(model_id, revision)
            if looks_like_path(model_id) or Path(model_id).expanduser().is_dir():
                print(f"{model_id}: a local folder ({where}); nothing to download")
            else:
                print(f"{model_id}: downloaded to {where}")
        else:
            info = {"runtime": "transformers"} | model.info(
                model_id,
                revision,
                try_load=not args.no_load,
                precision=cfg.engine.precision if cfg else "auto",
                threads=cfg.engine.threads if cfg else 0,
            )
            return _print_model_info(info, as_json=args.json)
    except model.ModelError as exc:
        print(f"docinbox: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"fix: {exc.hint}", file=sys.stderr)
        return ExitCode.ENGINE_UNAVAILABLE
    except Exception as exc:  # anything else from the hub: a sentence, not a traceback
        print(f"docinbox: {exc}", file=sys.stderr)
        return ExitCode.ENGINE_UNAVAILABLE
    return ExitCode.OK


def _model_runtime(args: argparse.Namespace, engine: EngineConfig, model_id: str) -> int:
    """`model pull|info` for the http and llama-cpp runtimes."""
    from daemon.cli import model

    if args.model_cmd == "pull":
        if engine.runtime == "http":
            print("engine.runtime is http: the server holds the weights; nothing to pull here "
                  "(`docinbox model info` asks it what it serves)")
            return ExitCode.OK
        main, mmproj = model.pull_gguf(model_id, engine.llama_cpp)
        print(f"{model_id}: GGUF pair for llama.cpp:\n  model:  {main}\n  mmproj: {mmproj}")
        return ExitCode.OK
    return _print_model_info(
        model.runtime_info(engine, model_id, try_load=not args.no_load), as_json=args.json
    )


def _print_model_info(info: dict[str, Any], *, as_json: bool) -> int:
    """`model info`'s report, whatever the runtime; a model missing or not loading fails."""
    print(
        json.dumps(info, indent=2, default=str)
        if as_json
        else "\n".join(f"{k}: {v}" for k, v in info.items())
    )
    if not info["available"] or info.get("loads") is False:
        print(f"docinbox: {info['error']}", file=sys.stderr)
        if info.get("hint"):
            print(f"fix: {info['hint']}", file=sys.stderr)
        return ExitCode.ENGINE_UNAVAILABLE
    return ExitCode.OK


def _common_options(*, defaults: bool) -> argparse.ArgumentParser:
    """--config and -v, accepted before and after the subcommand.

    A subparser writes its defaults over what the main parser already parsed, so
    `docinbox --config X run` would silently lose X if the subcommands had defaults of
    their own: only the main parser has them, the subcommands' copies are SUPPRESSed.
    """
    common = argparse.ArgumentParser(add_help=False)
    extra: dict[str, Any] = {} if defaults else {"default": argparse.SUPPRESS}
    common.add_argument(
        "--config", "-c", help="config file (default: $DOCINBOX_CONFIG or ./config.yaml)",
        **extra,
    )
    common.add_argument("--verbose", "-v", action="store_true", help="debug logging", **extra)
    return common


def build_parser() -> argparse.ArgumentParser:
    common = _common_options(defaults=False)
    p = argparse.ArgumentParser(
        prog="docinbox",
        parents=[_common_options(defaults=True)],
        description="Turn documents dropped into a folder into Markdown and JSON.",
        epilog="exit codes: 0 ok, 1 a document failed (parse), 2 usage, 3 no such job or "
        "nothing to do, 4 engine unavailable, 5 already running, 78 bad configuration, "
        "130 interrupted",
    )
    p.add_argument("--version", action="version", version=f"docinbox {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)
    _add_daemon_commands(sub, common)
    _add_job_commands(sub, common)
    _add_config_command(sub, common)
    _add_hooks_command(sub, common)
    _add_model_command(sub, common)
    return p


def _add_daemon_commands(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """run, parse: the daemon, and its pipeline once on named files."""
    s = sub.add_parser("run", parents=[common], help="watch the inboxes and process documents")
    s.set_defaults(fn=cmd_run)

    s = sub.add_parser("parse", parents=[common], help="convert files once, without the daemon")
    s.add_argument("files", nargs="+")
    s.add_argument("-o", "--output", default=".", help="output folder (default: .)")
    s.add_argument("--engine", help="engine to use instead of the configured one")
    s.add_argument("--pages", help="1-based pages to convert, e.g. 1-3,7 (default: all)")
    s.set_defaults(fn=cmd_parse)


def _add_job_commands(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """status, list, retry, reprocess, vacuum: what the record says, and queueing jobs again."""
    s = sub.add_parser("status", parents=[common], help="what the daemon is doing")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_status)

    s = sub.add_parser("list", parents=[common], help="list jobs")
    s.add_argument("--state", choices=[x.value for x in JobState])
    s.add_argument("--limit", type=int, default=100)
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_list)

    s = sub.add_parser("retry", parents=[common], help="queue failed job(s) again")
    g = s.add_mutually_exclusive_group(required=True)
    g.add_argument("id", nargs="?", type=int)
    g.add_argument("--failed", action="store_true", help="every failed job")
    s.set_defaults(fn=cmd_retry)

    s = sub.add_parser("reprocess", parents=[common], help="run done job(s) again")
    g = s.add_mutually_exclusive_group(required=True)
    g.add_argument("id", nargs="?", type=int)
    g.add_argument("--all", action="store_true", help="every done job")
    s.set_defaults(fn=cmd_reprocess)

    s = sub.add_parser("vacuum", parents=[common], help="compact the state database")
    s.set_defaults(fn=cmd_vacuum)


def _add_config_command(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """check-config: validate, show, or say what the systemd unit needs."""
    s = sub.add_parser("check-config", parents=[common], help="validate the configuration")
    s.add_argument("--show", action="store_true", help="print the effective configuration")
    s.add_argument(
        "--systemd",
        action="store_true",
        help="print the ReadWritePaths= drop-in the systemd unit needs for these folders",
    )
    s.set_defaults(fn=cmd_check_config)


def _add_hooks_command(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """hooks [list|retry|test]: the events for webhooks and commands."""
    s = sub.add_parser(
        "hooks", parents=[common], help="events for webhooks and commands: list, retry, test"
    )
    s.add_argument("--limit", type=int, default=100)
    s.add_argument("--json", action="store_true")
    hsub = s.add_subparsers(dest="hooks_cmd")
    h = hsub.add_parser("list", parents=[common], help="events waiting or given up (default)")
    h.add_argument("--limit", type=int, default=100)
    h.add_argument("--json", action="store_true")
    h = hsub.add_parser("retry", parents=[common], help="send event(s) again")
    g = h.add_mutually_exclusive_group(required=True)
    g.add_argument("id", nargs="?", help="the event's number or id, as `docinbox hooks` lists it")
    g.add_argument("--dead", action="store_true", help="every given-up delivery")
    h = hsub.add_parser("test", parents=[common], help="send a test event to each hook now")
    h.add_argument("name", nargs="?", help="only this hook")
    s.set_defaults(fn=cmd_hooks)


def _add_model_command(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """model pull|info: the weights of the configured runtime."""
    s = sub.add_parser("model", parents=[common], help="MinerU2.5 weights: pull or info")
    msub = s.add_subparsers(dest="model_cmd", required=True)
    for name in ("pull", "info"):
        m = msub.add_parser(name, parents=[common])
        m.add_argument("--model", help="hub id or local folder (default: engine.model)")
        m.add_argument("--revision")
        m.add_argument(
            "--runtime",
            choices=("transformers", "http", "llama-cpp"),
            help="transformers weights, llama.cpp's GGUF pair, or ask the http server "
            "(default: engine.runtime)",
        )
        if name == "info":
            m.add_argument("--no-load", action="store_true", help="do not try to load it")
            m.add_argument("--json", action="store_true")
        m.set_defaults(fn=cmd_model)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.fn(args))
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
