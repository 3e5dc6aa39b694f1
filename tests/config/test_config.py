"""Configuration loading and filesystem checks (daemon/config/settings.py, config.yaml)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from daemon.config.schema import Setting, declared
from daemon.config.settings import (
    ENV_CONFIG,
    PAGE_OPTION_KEYS,
    README_BEGIN,
    README_END,
    Config,
    ConfigError,
    InboxConfig,
    Problem,
    check_paths,
    inbox_for,
    load_config,
    page_options_for,
    parse_size,
    readme_table,
    redacted_dict,
    resolve_config_path,
)
from daemon.document.formats import DEFAULT_PATTERNS
from tests.conftest import REPO

SHIPPED = REPO / "config.yaml"

SECRET_A = "hunter2-very-secret"
SECRET_B = "0123"


def write(tmp_path: Path, text: str, name: str = "config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def minimal(tmp_path: Path, extra: str = "") -> Path:
    return write(tmp_path, "inboxes: [./inbox]\noutbox: ./outbox\n" + textwrap.dedent(extra))


def problems_of(path: Path) -> list[Problem]:
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return info.value.problems


def by_key(problems: list[Problem]) -> dict[str, Problem]:
    return {p.key: p for p in problems}


# -- the shipped file -------------------------------------------------------------------


def test_shipped_config_loads_with_documented_values(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    shutil.copy(SHIPPED, path)
    cfg = load_config(path)

    assert cfg.source == path
    assert cfg.inboxes == (InboxConfig(path=tmp_path / "inbox"),)
    assert cfg.outbox == tmp_path / "outbox"
    assert cfg.archive == tmp_path / "archive"
    assert cfg.failed == tmp_path / "failed"
    assert cfg.duplicates == tmp_path / "duplicates"
    assert cfg.state_dir == tmp_path / "state"
    assert cfg.after_success == "archive"
    assert cfg.on_duplicate == "move"
    assert cfg.stability_seconds == 5
    assert cfg.rescan_seconds == 300
    assert cfg.engine.name == "mineru"
    assert cfg.engine.fallback_engine == "lite"
    assert cfg.engine.model == "opendatalab/MinerU2.5-2509-1.2B"
    assert cfg.engine.precision == "auto"
    assert cfg.engine.threads == 0
    assert cfg.engine.text_layer == "auto"
    assert cfg.engine.dpi == 200
    assert cfg.passwords == ()
    assert cfg.http.enabled is False
    assert cfg.http.host == "127.0.0.1"


def test_shipped_config_matches_dataclass_defaults(tmp_path: Path) -> None:
    # The file documents the defaults; it must not silently disagree with the code.
    path = tmp_path / "config.yaml"
    shutil.copy(SHIPPED, path)
    cfg = load_config(path)
    (tmp_path / "bare").mkdir()
    bare = load_config(minimal(tmp_path / "bare"))
    assert cfg.engine == bare.engine
    assert cfg.limits == bare.limits
    assert cfg.worker == bare.worker
    assert cfg.logging == bare.logging
    assert cfg.http == bare.http


def test_shipped_config_passes_check_paths_once_inbox_exists(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    shutil.copy(SHIPPED, path)
    (tmp_path / "inbox").mkdir()
    assert check_paths(load_config(path)) == []


# -- locating the file ------------------------------------------------------------------


def test_resolve_config_path_prefers_argument_then_env_then_cwd(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(ENV_CONFIG, str(tmp_path / "from-env.yaml"))
    assert resolve_config_path(str(tmp_path / "arg.yaml")) == tmp_path / "arg.yaml"
    assert resolve_config_path(None) == tmp_path / "from-env.yaml"
    monkeypatch.setenv(ENV_CONFIG, "")
    assert resolve_config_path(None) == Path("config.yaml")
    monkeypatch.delenv(ENV_CONFIG)
    assert resolve_config_path(None) == Path("config.yaml")


def test_resolve_config_path_expands_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve_config_path("~/docinbox.yaml") == tmp_path / "docinbox.yaml"
    assert resolve_config_path(None, environ={ENV_CONFIG: "~/x.yaml"}) == tmp_path / "x.yaml"


# -- values -----------------------------------------------------------------------------


def test_minimal_config_gets_sibling_defaults(tmp_path: Path) -> None:
    cfg = load_config(minimal(tmp_path))
    assert cfg.archive == tmp_path / "archive"
    assert cfg.failed == tmp_path / "failed"
    assert cfg.duplicates == tmp_path / "duplicates"
    assert cfg.state_dir == tmp_path / "state"
    assert cfg.db_path == tmp_path / "state" / "docinbox.sqlite3"
    assert cfg.inboxes[0].patterns == DEFAULT_PATTERNS


def test_relative_paths_resolve_against_config_folder_not_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf_dir = tmp_path / "etc" / "docinbox"
    conf_dir.mkdir(parents=True)
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    path = write(
        conf_dir,
        """\
        inboxes:
          - ../../scans/in
          - path: ~/phone
        outbox: out
        state_dir: /var/lib/docinbox
        engine:
          model: ./weights/mineru
        logging:
          file: logs/docinbox.log
        """,
    )
    cfg = load_config(Path(os.path.relpath(path, elsewhere)))
    assert cfg.inboxes[0].path == tmp_path / "scans" / "in"
    assert cfg.inboxes[1].path == tmp_path / "home" / "phone"
    assert cfg.outbox == conf_dir / "out"
    assert cfg.state_dir == Path("/var/lib/docinbox")
    assert cfg.engine.model == str(conf_dir / "weights" / "mineru")
    assert cfg.logging.file == conf_dir / "logs" / "docinbox.log"
    assert cfg.source == path


def test_hub_model_id_is_not_treated_as_a_path(tmp_path: Path) -> None:
    cfg = load_config(minimal(tmp_path, "engine: {model: org/some-model}\n"))
    assert cfg.engine.model == "org/some-model"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("512MiB", 512 * 1024**2),
        ("512MB", 512 * 1000**2),
        ("1.5 GiB", 1536 * 1024**2),
        ("200k", 200_000),
        ("200 KiB", 200 * 1024),
        ("4096", 4096),
        ("10b", 10),
        ("2T", 2 * 1000**4),
        (" 3 mb ", 3_000_000),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "MB", "1.2.3GB", "12 parsecs", "-5MB", "five"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_size(text)


def test_size_key_maps_to_max_file_bytes(tmp_path: Path) -> None:
    cfg = load_config(minimal(tmp_path, 'limits: {max_file_size: "1.5 GiB"}\n'))
    assert cfg.limits.max_file_bytes == 1536 * 1024**2
    cfg = load_config(minimal(tmp_path, "limits: {max_file_size: 1000}\n"))
    assert cfg.limits.max_file_bytes == 1000


def test_bad_size_is_reported_with_unit_hint(tmp_path: Path) -> None:
    p = by_key(problems_of(minimal(tmp_path, "limits: {max_file_size: 12 parsecs}\n")))
    assert "limits.max_file_size" in p
    assert "MiB" in p["limits.max_file_size"].hint


def test_inbox_mapping_form(tmp_path: Path) -> None:
    cfg = load_config(
        write(
            tmp_path,
            """\
            inboxes:
              - path: scans
                recursive: false
                patterns: ["*.pdf"]
                watch: poll
                output_subfolder: invoices/
                engine_options: {dpi: 300, text_layer: "off"}
            outbox: out
            """,
        )
    )
    (inbox,) = cfg.inboxes
    assert inbox == InboxConfig(
        path=tmp_path / "scans",
        recursive=False,
        patterns=("*.pdf",),
        watch="poll",
        output_subfolder="invoices",
        engine_options={"dpi": 300, "text_layer": "off"},
    )


def test_logging_level_is_case_insensitive(tmp_path: Path) -> None:
    cfg = load_config(minimal(tmp_path, "logging: {level: debug}\n"))
    assert cfg.logging.level == "DEBUG"


def test_null_fallback_engine_and_plugin_name(tmp_path: Path) -> None:
    cfg = load_config(
        minimal(tmp_path, "engine: {name: 'tests.fake_engines:Crashy', fallback_engine: null}\n")
    )
    assert cfg.engine.name == "tests.fake_engines:Crashy"
    assert cfg.engine.fallback_engine is None


def test_empty_section_means_defaults(tmp_path: Path) -> None:
    # Every sub-key commented out leaves `engine:` as null; that must not be an error.
    cfg = load_config(minimal(tmp_path, "engine:\nlimits:\n"))
    assert cfg.engine.name == "mineru"


# -- problems ---------------------------------------------------------------------------


def test_unknown_top_level_key_suggests_close_match(tmp_path: Path) -> None:
    p = by_key(problems_of(minimal(tmp_path, "outbx: ./x\n")))
    assert p["outbx"].message.startswith("unknown key")
    assert "'outbox'" in p["outbx"].hint


def test_unknown_nested_keys_suggest_close_match(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        inboxes:
          - path: ./in
            recursiv: true
            engine_options: {dpii: 300}
        outbox: ./out
        engine:
          fallback_engin: lite
        worker:
          max_attempt: 2
        """,
    )
    p = by_key(problems_of(path))
    assert "'recursive'" in p["inboxes[0].recursiv"].hint
    assert "'dpi'" in p["inboxes[0].engine_options.dpii"].hint
    assert "'fallback_engine'" in p["engine.fallback_engin"].hint
    assert "'max_attempts'" in p["worker.max_attempt"].hint


def test_key_in_wrong_section_says_where_it_belongs(tmp_path: Path) -> None:
    p = by_key(problems_of(minimal(tmp_path, "dpi: 300\n")))
    assert "engine" in p["dpi"].hint


def test_engine_options_only_accept_page_keys(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        inboxes: [{path: ./in, engine_options: {model: other/model, dpi: 10}}]
        outbox: ./out
        """,
    )
    p = by_key(problems_of(path))
    assert p["inboxes[0].engine_options.model"].message.startswith("unknown key")
    assert "inboxes[0].engine_options.dpi" in p


def test_all_problems_are_reported_at_once(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        inboxes:
          - ./ok
          - path: ./in
            watch: sometimes
          - 42
        after_success: shred
        stability_seconds: -1
        rescan_seconds: 5m
        engine:
          name: tesseract
          dpi: 1200
          threads: yes
        limits:
          max_pages: 0
        worker:
          heartbeat_seconds: 10
          heartbeat_timeout_seconds: 5
        logging:
          level: loud
        http:
          port: 70000
        """,
    )
    keys = {p.key for p in problems_of(path)}
    assert keys >= {
        "outbox",
        "inboxes[1].watch",
        "inboxes[2]",
        "after_success",
        "stability_seconds",
        "rescan_seconds",
        "engine.name",
        "engine.dpi",
        "engine.threads",
        "limits.max_pages",
        "worker.heartbeat_timeout_seconds",
        "logging.level",
        "http.port",
    }


def test_bad_enum_lists_allowed_values_and_line(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        inboxes:
          - ./a
          - path: ./b
            watch: evnts
        outbox: ./out
        """,
    )
    (problem,) = problems_of(path)
    assert problem.key == "inboxes[1].watch"
    assert "'evnts'" in problem.message
    assert "line 4" in problem.message
    assert "auto, events, poll" in problem.hint
    assert "'events'" in problem.hint  # the close match


def test_missing_required_keys(tmp_path: Path) -> None:
    keys = {p.key for p in problems_of(write(tmp_path, "after_success: keep\n"))}
    assert keys == {"inboxes", "outbox"}
    keys = {p.key for p in problems_of(write(tmp_path, "inboxes: []\noutbox: o\n"))}
    assert keys == {"inboxes"}
    keys = {
        p.key for p in problems_of(write(tmp_path, "inboxes: [{recursive: true}]\noutbox: o\n"))
    }
    assert keys == {"inboxes[0].path"}


def test_empty_file_reports_required_keys(tmp_path: Path) -> None:
    keys = {p.key for p in problems_of(write(tmp_path, "# nothing yet\n"))}
    assert keys == {"inboxes", "outbox"}


def test_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    (problem,) = problems_of(write(tmp_path, "- a\n- b\n"))
    assert "mapping" in problem.message


def test_wrong_types(tmp_path: Path) -> None:
    path = minimal(
        tmp_path,
        """\
        stability_seconds: true
        engine: {text_layer: off}
        hooks: {webhooks: [{url: "https://example.org/h", events: document.done}]}
        http: {enabled: "yes"}
        worker: [1, 2]
        """,
    )
    p = by_key(problems_of(path))
    assert "engine.text_layer" in p  # bare `off` is YAML false, not the word "off"
    assert "list" in p["hooks.webhooks[0].events"].hint
    assert "without quotes" in p["http.enabled"].hint
    assert "stability_seconds" in p
    assert "worker" in p


def test_null_for_required_value_is_reported(tmp_path: Path) -> None:
    p = by_key(problems_of(minimal(tmp_path, "engine:\n  dpi:\n")))
    assert "remove the line" in p["engine.dpi"].hint


def test_output_subfolder_cannot_escape(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        inboxes:
          - {path: ./a, output_subfolder: ../elsewhere}
          - {path: ./b, output_subfolder: /abs}
        outbox: ./out
        """,
    )
    keys = {p.key for p in problems_of(path)}
    assert keys == {"inboxes[0].output_subfolder", "inboxes[1].output_subfolder"}


def test_fallback_equal_to_engine_is_reported(tmp_path: Path) -> None:
    p = by_key(problems_of(minimal(tmp_path, "engine: {name: lite, fallback_engine: lite}\n")))
    assert "engine.fallback_engine" in p


def test_duplicate_keys_are_reported(tmp_path: Path) -> None:
    path = minimal(tmp_path, "engine: {dpi: 100}\nengine: {dpi: 300}\n")
    (problem,) = problems_of(path)
    assert problem.key == "engine"
    assert "lines 3 and 4" in problem.message


def test_yaml_syntax_error_has_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, "inboxes: [./in]\noutbox: ./out\nengine:\n  dpi: [300\n")
    (problem,) = problems_of(path)
    assert problem.key == str(path)
    assert "YAML syntax error at line" in problem.message
    assert "column" in problem.message


def test_missing_file(tmp_path: Path) -> None:
    (problem,) = problems_of(tmp_path / "nope.yaml")
    assert "not found" in problem.message
    assert ENV_CONFIG in problem.hint


def test_config_path_is_a_folder(tmp_path: Path) -> None:
    (problem,) = problems_of(tmp_path)
    assert "folder" in problem.message


def test_unreadable_file(tmp_path: Path) -> None:
    path = minimal(tmp_path)
    path.chmod(0)
    try:
        if os.access(path, os.R_OK):
            pytest.skip("running as root: chmod 0 does not stop reads")
        (problem,) = problems_of(path)
        assert "permission denied" in problem.message
    finally:
        path.chmod(0o600)


# -- passwords --------------------------------------------------------------------------


def test_passwords_load_and_never_leak(tmp_path: Path) -> None:
    path = minimal(tmp_path, f"passwords: [{SECRET_A!r}, {SECRET_B!r}]\n")
    cfg = load_config(path)
    assert cfg.passwords == (SECRET_A, SECRET_B)
    assert SECRET_A not in repr(cfg)
    red = redacted_dict(cfg)
    assert red["passwords"] == ["***", "***"]
    dumped = yaml.safe_dump(red)
    assert SECRET_A not in dumped
    assert "'0123'" not in dumped


def test_passwords_never_appear_in_errors(tmp_path: Path) -> None:
    # A password in a misplaced key, a non-string password, and a syntax error on the
    # password line: none of the messages may contain the secret.
    path = minimal(
        tmp_path,
        f"""\
        passwords: [{SECRET_A!r}, 987654, ""]
        engine: {{passwords: [{SECRET_A!r}]}}
        pasword: [{SECRET_A!r}]
        """,
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    text = str(info.value) + repr(info.value.problems)
    assert SECRET_A not in text
    assert "987654" not in text
    keys = {p.key for p in info.value.problems}
    assert keys >= {"passwords[1]", "passwords[2]", "engine.passwords", "pasword"}
    assert "quotes" in by_key(info.value.problems)["passwords[1]"].hint

    broken = write(tmp_path, f'inboxes: [a]\noutbox: b\npasswords: ["{SECRET_A}\n', "broken.yaml")
    with pytest.raises(ConfigError) as info:
        load_config(broken)
    assert SECRET_A not in str(info.value)


def test_redacted_dict_round_trips_and_masks_plugin_secrets(tmp_path: Path) -> None:
    path = minimal(
        tmp_path,
        """\
        limits: {max_file_size: 2MiB}
        engine:
          name: "plugins.remote:Engine"
          options: {api_token: abc-secret, endpoint: "http://x"}
        """,
    )
    red = redacted_dict(load_config(path))
    assert red["engine"]["options"] == {"api_token": "***", "endpoint": "http://x"}
    assert red["limits"]["max_file_size"] == 2 * 1024**2
    again = write(tmp_path, yaml.safe_dump(red), "again.yaml")
    reloaded = load_config(again)
    assert reloaded.limits.max_file_bytes == 2 * 1024**2
    assert reloaded.inboxes == load_config(path).inboxes


# -- helpers ----------------------------------------------------------------------------


def make_cfg(tmp_path: Path, text: str) -> Config:
    return load_config(write(tmp_path, text))


def test_page_options_merge_inbox_overrides(tmp_path: Path) -> None:
    cfg = make_cfg(
        tmp_path,
        """\
        inboxes:
          - ./plain
          - {path: ./fine, engine_options: {dpi: 300, text_layer: "off", max_new_tokens_block: 64}}
        outbox: ./out
        engine: {dpi: 150, max_long_side: 3000}
        """,
    )
    plain = page_options_for(cfg, cfg.inboxes[0])
    assert plain.text_layer == "auto"
    assert (plain.dpi, plain.max_long_side, plain.pages) == (150, 3000, None)
    fine = cfg.page_options_for(cfg.inboxes[1])
    assert fine.text_layer == "off"
    assert fine.max_new_tokens_block == 64
    assert fine.max_new_tokens_layout == 1536
    assert (fine.dpi, fine.max_long_side, fine.pages) == (300, 3000, None)
    assert page_options_for(cfg, None).dpi == 150


def test_inbox_for_picks_deepest_and_respects_recursive(tmp_path: Path) -> None:
    cfg = make_cfg(
        tmp_path,
        """\
        inboxes:
          - ./scans
          - ./scans/invoices
          - {path: ./flat, recursive: false}
        outbox: ./out
        """,
    )
    scans, invoices, flat = cfg.inboxes
    assert inbox_for(cfg, tmp_path / "scans" / "a.pdf") is scans
    assert inbox_for(cfg, tmp_path / "scans" / "x" / "a.pdf") is scans
    assert inbox_for(cfg, tmp_path / "scans" / "invoices" / "2024" / "a.pdf") is invoices
    assert inbox_for(cfg, tmp_path / "flat" / "a.pdf") is flat
    assert inbox_for(cfg, tmp_path / "flat" / "sub" / "a.pdf") is None
    assert inbox_for(cfg, tmp_path / "out" / "a.md") is None
    assert inbox_for(cfg, tmp_path / "scans") is None


def test_inbox_for_through_symlink(tmp_path: Path) -> None:
    real = tmp_path / "mnt" / "nas"
    real.mkdir(parents=True)
    (tmp_path / "link").symlink_to(real)
    cfg = make_cfg(tmp_path, "inboxes: [./link]\noutbox: ./out\n")
    assert inbox_for(cfg, real / "a.pdf") is cfg.inboxes[0]
    assert inbox_for(cfg, tmp_path / "link" / "a.pdf") is cfg.inboxes[0]


# -- check_paths ------------------------------------------------------------------------


def test_check_paths_creates_output_folders(tmp_path: Path) -> None:
    (tmp_path / "inbox").mkdir()
    cfg = make_cfg(tmp_path, "inboxes: [./inbox]\noutbox: ./deep/er/outbox\n")
    assert check_paths(cfg) == []
    for folder in (cfg.outbox, cfg.archive, cfg.failed, cfg.duplicates, cfg.state_dir):
        assert folder.is_dir()
    assert (cfg.state_dir.stat().st_mode & 0o777) == 0o700
    assert not any(p.name.startswith(".docinbox-write-test") for p in cfg.outbox.iterdir())


def test_check_paths_without_create_reports_missing(tmp_path: Path) -> None:
    (tmp_path / "inbox").mkdir()
    cfg = make_cfg(tmp_path, "inboxes: [./inbox]\noutbox: ./outbox\n")
    keys = {p.key for p in check_paths(cfg, create=False)}
    assert keys == {"outbox", "archive", "failed", "duplicates", "state_dir"}
    assert not cfg.outbox.exists()


def test_check_paths_skips_unused_archive_and_duplicates(tmp_path: Path) -> None:
    (tmp_path / "inbox").mkdir()
    cfg = make_cfg(
        tmp_path,
        "inboxes: [./inbox]\noutbox: ./o\nafter_success: delete\non_duplicate: keep\n",
    )
    assert check_paths(cfg) == []
    assert not cfg.archive.exists()
    assert not cfg.duplicates.exists()


def test_check_paths_reports_missing_inbox_with_mkdir_hint(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path, "inboxes: [./inbox, ./nas/share]\noutbox: ./outbox\n")
    (tmp_path / "inbox").mkdir()
    (problem,) = check_paths(cfg)
    assert problem.key == "inboxes[1].path"
    assert "mounted" in problem.hint
    assert "mkdir -p" in problem.hint
    assert not (tmp_path / "nas").exists()  # never created: it may be an unmounted share


def test_check_paths_inbox_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "inbox").write_text("x")
    cfg = make_cfg(tmp_path, "inboxes: [./inbox]\noutbox: ./outbox\n")
    (problem,) = check_paths(cfg)
    assert problem.key == "inboxes[0].path"
    assert "not a folder" in problem.message


def test_check_paths_refuses_outbox_inside_inbox(tmp_path: Path) -> None:
    (tmp_path / "inbox").mkdir()
    cfg = make_cfg(tmp_path, "inboxes: [./inbox]\noutbox: ./inbox/converted\n")
    problems = check_paths(cfg)
    (problem,) = [p for p in problems if p.key == "outbox"]
    assert "inside inbox inboxes[0]" in problem.message
    assert "ingest its own output" in problem.message
    assert not cfg.outbox.exists()  # refused before anything is created inside the inbox


def test_check_paths_refuses_outbox_equal_to_inbox_via_symlink(tmp_path: Path) -> None:
    (tmp_path / "inbox").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "inbox")
    cfg = make_cfg(tmp_path, "inboxes: [./inbox]\noutbox: ./alias\n")
    keys = {p.key for p in check_paths(cfg)}
    assert "outbox" in keys


def test_check_paths_refuses_inbox_inside_state_dir(tmp_path: Path) -> None:
    (tmp_path / "state" / "drop").mkdir(parents=True)
    cfg = make_cfg(tmp_path, "inboxes: [./state/drop]\noutbox: ./outbox\n")
    problems = check_paths(cfg)
    (problem,) = [p for p in problems if p.key == "inboxes[0].path"]
    assert "inside state_dir" in problem.message


def test_check_paths_refuses_nested_and_repeated_inboxes(tmp_path: Path) -> None:
    for name in ("a", "a/b", "c"):
        (tmp_path / name).mkdir()
    cfg = make_cfg(tmp_path, "inboxes: [./a, ./a/b, ./c, ./c/]\noutbox: ./outbox\n")
    p = by_key(check_paths(cfg))
    assert "inside inboxes[0]" in p["inboxes[1].path"].message
    assert "same folder as inboxes[2]" in p["inboxes[3].path"].message


def test_check_paths_outputs_must_be_distinct(tmp_path: Path) -> None:
    (tmp_path / "inbox").mkdir()
    cfg = make_cfg(
        tmp_path,
        "inboxes: [./inbox]\noutbox: ./out\narchive: ./done\nfailed: ./done\n",
    )
    (problem,) = check_paths(cfg)
    assert problem.key == "failed"
    assert "archive" in problem.message


def test_check_paths_reports_unwritable_folder(tmp_path: Path) -> None:
    # A regular file where a folder should be cannot be written into as a folder by anyone,
    # root included (chmod 0o500 would not stop root).
    (tmp_path / "inbox").mkdir()
    (tmp_path / "failed").write_text("not a folder")
    cfg = make_cfg(tmp_path, "inboxes: [./inbox]\noutbox: ./outbox\n")
    (problem,) = check_paths(cfg)
    assert problem.key == "failed"
    assert "not a folder" in problem.message


def test_check_paths_reports_uncreatable_folder(tmp_path: Path) -> None:
    (tmp_path / "inbox").mkdir()
    (tmp_path / "blocker").write_text("a file, so nothing can be created below it")
    cfg = make_cfg(tmp_path, "inboxes: [./inbox]\noutbox: ./blocker/outbox\n")
    (problem,) = check_paths(cfg)
    assert problem.key == "outbox"
    assert "cannot create" in problem.message


def test_check_paths_reports_read_only_folder_for_non_root(tmp_path: Path) -> None:
    (tmp_path / "inbox").mkdir()
    ro = tmp_path / "outbox"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if os.access(ro, os.W_OK):
            pytest.skip("running as root: mode bits do not stop writes (covered by the file case)")
        cfg = make_cfg(tmp_path, "inboxes: [./inbox]\noutbox: ./outbox\n")
        (problem,) = check_paths(cfg)
        assert problem.key == "outbox"
        assert "not writable" in problem.message
    finally:
        ro.chmod(0o700)


def test_check_paths_reports_everything_at_once(tmp_path: Path) -> None:
    (tmp_path / "failed").write_text("x")
    cfg = make_cfg(
        tmp_path,
        "inboxes: [./missing, ./in]\noutbox: ./in/out\n",
    )
    (tmp_path / "in").mkdir()
    keys = {p.key for p in check_paths(cfg)}
    assert keys == {"inboxes[0].path", "outbox", "failed"}


def test_problems_come_in_file_order(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        engine: {dpi: 1}
        inboxes: [{path: ./in, watch: x}]
        after_success: x
        """,
    )
    keys = [p.key for p in problems_of(path)]
    assert keys == ["engine.dpi", "inboxes[0].watch", "after_success", "outbox"]


def test_page_ranges_parse_and_validate(tmp_path: Path) -> None:
    from daemon.config.settings import parse_page_range

    assert parse_page_range("1-3,7", 10) == [0, 1, 2, 6]
    assert parse_page_range("2-", 4) == [1, 2, 3]
    assert parse_page_range("9", 3) == []
    for bad in ("0", "3-1", "x", "1-2-3"):
        with pytest.raises(ValueError):
            parse_page_range(bad, 10)


# -- one declaration per key ------------------------------------------------------------


def _declared_keys(cls: type, prefix: str = "") -> list[tuple[str, Setting]]:
    """(YAML key path, its Setting) for every leaf key declared under `cls`."""
    out: list[tuple[str, Setting]] = []
    for f, s in declared(cls):
        path = f"{prefix}.{s.key_for(f.name)}" if prefix else s.key_for(f.name)
        if s.section is not None:
            out += _declared_keys(s.section, path)
        else:
            out.append((path, s))
            if s.items is not None:
                out += _declared_keys(s.items, f"{path}[]")
    return out


def test_readme_config_table_is_generated_from_the_declarations() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert README_BEGIN in text and README_END in text
    block = text.split(README_BEGIN, 1)[1].split(README_END, 1)[0]
    assert block == "\n" + readme_table(), "stale: run .venv/bin/python scripts/readme_tables.py"
    for path, _ in _declared_keys(Config):
        assert f"| `{path}` |" in block


def test_shipped_config_lists_every_declared_key() -> None:
    # config.yaml is the commented reference: every key is there, set to its default
    # (test_shipped_config_matches_dataclass_defaults checks the values).
    text = SHIPPED.read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    missing = []
    for path, _ in _declared_keys(Config):
        if "[]." in path:
            # Per-item keys (inboxes, hooks) are documented in the comment above the list.
            if f"#   {path.split('[].', 1)[1]}:" not in text:
                missing.append(path)
            continue
        node: object = data
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                missing.append(path)
                break
            node = node[part]
    assert missing == [], "declared but not in config.yaml"


def test_every_secret_is_masked_and_kept_out_of_reprs(tmp_path: Path) -> None:
    # Every key declared secret=True gets a value, so a secret added later is covered too.
    secrets = [path for path, s in _declared_keys(Config) if s.secret]
    assert {"passwords", "http.token", "engine.http.api_key"} <= set(secrets)
    data = yaml.safe_load(minimal(tmp_path).read_text())
    for path in secrets:
        *sections, name = path.split(".")
        node = data
        for part in sections:
            node = node.setdefault(part, {})
        node[name] = [SECRET_A] if name == "passwords" else SECRET_A
    cfg = load_config(write(tmp_path, yaml.safe_dump(data), "secrets.yaml"))
    shown = redacted_dict(cfg)
    for path in secrets:
        value: object = shown
        for part in path.split("."):
            assert isinstance(value, dict)
            value = value[part]
        assert value in ("***", ["***"]), path
    assert SECRET_A not in yaml.safe_dump(shown)
    assert SECRET_A not in repr(cfg)


def test_renamed_key_round_trips_under_its_yaml_name(tmp_path: Path) -> None:
    red = redacted_dict(load_config(minimal(tmp_path)))
    assert "max_file_size" in red["limits"]
    assert "max_file_bytes" not in red["limits"]


def test_page_keys_are_the_ones_an_inbox_may_override() -> None:
    page = {path.removeprefix("engine.") for path, s in _declared_keys(Config) if s.page}
    assert page == set(PAGE_OPTION_KEYS)
    assert {"dpi", "text_layer", "pages"} <= page


def test_reading_the_config_stays_light(tmp_path: Path) -> None:
    # The daemon process reads its config; that must not pull in Pillow, numpy or torch.
    cfg = minimal(tmp_path)
    (tmp_path / "inbox").mkdir()
    code = (
        "import sys; from daemon.config.settings import load_config, check_paths, redacted_dict;"
        f"cfg = load_config({str(cfg)!r}); check_paths(cfg); redacted_dict(cfg);"
        "heavy = [m for m in ('PIL', 'numpy', 'torch') if m in sys.modules];"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


def test_page_keys_are_exactly_the_page_options_fields() -> None:
    # page_options_for passes the page keys by name: a page key without a PageOptions
    # field (or the reverse) would be lost on the way to the worker.
    import dataclasses

    from daemon.document.page import PageOptions

    assert {f.name for f in dataclasses.fields(PageOptions)} == set(PAGE_OPTION_KEYS)


def test_page_keys_take_their_defaults_from_page_options(tmp_path: Path) -> None:
    # One source of truth: a page no config reached (a test, a plugin engine's own use) is
    # read exactly as one under a config that leaves the page keys alone.
    from daemon.document.page import PageOptions

    cfg = load_config(minimal(tmp_path))
    assert page_options_for(cfg, None) == PageOptions()
    assert page_options_for(cfg, cfg.inboxes[0]) == PageOptions()


def test_precision_names_are_declared_once_and_each_has_a_recipe() -> None:
    # engine.precision's names are the config's; the recipes behind them are the
    # engine's. A name without a recipe (or a recipe no key can choose) fails here.
    from typing import get_args

    from daemon.config.settings import LOSSY_PRECISIONS, EngineConfig, Precision
    from daemon.engines.mineru.runtimes import transformers_model
    from daemon.engines.mineru.runtimes.decoder_precision import PRECISIONS

    names = set(get_args(Precision))
    assert set(PRECISIONS) == names - {"auto"}
    assert set(LOSSY_PRECISIONS) <= set(PRECISIONS)
    assert set(transformers_model.PRECISIONS) == names
    assert EngineConfig().model == transformers_model.DEFAULT_MODEL


def test_retention_days_takes_fractions_above_a_floor(tmp_path: Path) -> None:
    # A soak (or a user trying retention out) sets hours, not days.
    def days(text: str) -> float:
        cfg = load_config(minimal(tmp_path, f"hooks: {{retention_days: {text}}}\n"))
        return cfg.hooks.retention_days

    assert days("0.02") == 0.02
    assert days("7") == 7.0
    for bad in ("0", "0.0001", "-1", "true", "'2d'", ".nan"):
        p = by_key(problems_of(minimal(tmp_path, f"hooks: {{retention_days: {bad}}}\n")))
        assert "hooks.retention_days" in p, bad
    assert "0.001" in by_key(problems_of(minimal(tmp_path, "hooks: {retention_days: 0}\n")))[
        "hooks.retention_days"].hint
