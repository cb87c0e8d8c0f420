"""Settings: file, then environment, then flags; every mistake is one clear line, exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from proxy.settings import Settings, SettingsError, load_settings

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return str(path)


def test_defaults_match_the_design() -> None:
    settings = load_settings(None, {}, {})
    assert settings.server.host == "127.0.0.1" and settings.server.port == 8080
    assert settings.upstream.base_url == "https://api.openai.com/v1"
    assert settings.upstream.anthropic_base_url == "https://api.anthropic.com/v1"
    assert settings.admin.token is None
    assert settings.compaction.trigger_ratio == 0.85


def test_pinned_ratio_defaults_to_a_tenth_and_reaches_the_library() -> None:
    assert load_settings(None, {}, {}).compaction.pinned_ratio == 0.10
    environ = {"COMPACTION_PROXY__COMPACTION__PINNED_RATIO": "0.2"}
    section = load_settings(None, environ, {}).compaction
    assert section.library_settings(llm_timeout_s=5).pinned_ratio == 0.2


def test_trigger_tokens_is_off_by_default_and_the_environment_sets_it(tmp_path: Path) -> None:
    section = load_settings(None, {}, {}).compaction
    assert section.trigger_tokens is None and section.trigger.at(1_000_000) == 850_000
    environ = {"COMPACTION_PROXY__COMPACTION__TRIGGER_TOKENS": "200000"}
    section = load_settings(None, environ, {}).compaction
    assert section.library_settings(llm_timeout_s=5).trigger_tokens == 200_000
    assert section.trigger.at(1_000_000) == 200_000
    text = "compaction:\n  trigger_tokens: 200000\n"
    environ = {"COMPACTION_PROXY__COMPACTION__TRIGGER_TOKENS": "null"}
    assert load_settings(write(tmp_path, text), environ, {}).compaction.trigger_tokens is None


def test_compaction_mode_is_on_or_shadow_as_yaml_and_the_environment_write_it(
    tmp_path: Path,
) -> None:
    assert load_settings(None, {}, {}).compaction.mode == "on"
    # A bare `on` is YAML 1.1's true: it still means the mode.
    assert (
        load_settings(write(tmp_path, "compaction:\n  mode: on\n"), {}, {}).compaction.mode == "on"
    )
    environ = {"COMPACTION_PROXY__COMPACTION__MODE": "shadow"}
    assert load_settings(None, environ, {}).compaction.mode == "shadow"
    with pytest.raises(SettingsError, match=r"compaction\.mode"):
        load_settings(write(tmp_path, "compaction:\n  mode: dry\n"), {}, {})


def test_recall_is_on_with_three_rounds_by_default_and_yaml_may_write_it_bare(
    tmp_path: Path,
) -> None:
    section = load_settings(None, {}, {}).compaction
    assert (section.recall, section.recall_max_rounds) == ("on", 3)
    # Bare `on` / `off` are YAML 1.1 booleans: they still mean the words.
    text = "compaction:\n  recall: off\n  recall_max_rounds: 1\n"
    section = load_settings(write(tmp_path, text), {}, {}).compaction
    assert (section.recall, section.recall_max_rounds) == ("off", 1)
    environ = {"COMPACTION_PROXY__COMPACTION__RECALL": "on"}
    assert load_settings(write(tmp_path, text), environ, {}).compaction.recall == "on"
    with pytest.raises(SettingsError, match=r"compaction\.recall"):
        load_settings(write(tmp_path, "compaction:\n  recall: maybe\n"), {}, {})


def test_the_repository_config_yaml_loads_and_lists_every_key() -> None:
    from_file = load_settings(str(ROOT / "config.yaml"), {}, {})
    text = (ROOT / "config.yaml").read_text()
    for section, model in Settings.model_fields.items():
        assert f"{section}:" in text
        for key in model.annotation.model_fields:  # type: ignore[union-attr]
            assert f"  {key}:" in text, f"{section}.{key} missing from config.yaml"
    assert from_file.server.port == 8080


def test_environment_beats_the_file_and_flags_beat_both(tmp_path: Path) -> None:
    path = write(tmp_path, "server:\n  port: 9000\n  host: 10.0.0.1\nadmin:\n  token: file\n")
    environ = {
        "COMPACTION_PROXY__SERVER__PORT": "9100",
        "COMPACTION_PROXY__ADMIN__TOKEN": "0123",  # a string key keeps its digits
        "COMPACTION_PROXY__MODELS__CONTEXT_WINDOWS": '{"gpt-4o*": 128000, "small": 8192}',
        "COMPACTION_PROXY__UPSTREAM__API_KEY": "null",
        "UNRELATED": "x",
    }
    settings = load_settings(path, environ, {"server": {"port": 9200}})
    assert settings.server.port == 9200
    assert settings.server.host == "10.0.0.1"
    assert settings.admin.token == "0123"
    assert settings.upstream.api_key is None
    assert settings.models.context_window_for("small") == 8192
    assert load_settings(path, environ, {}).server.port == 9100


def test_context_window_exact_then_glob_then_default() -> None:
    settings = Settings.build(
        {
            "models": {
                "default_context_window": 1000,
                "context_windows": {"gpt-4o*": 128000, "gpt-4o-mini": 64000},
            }
        }
    )
    models = settings.models
    assert models.context_window_for("gpt-4o-mini") == 64000
    assert models.context_window_for("gpt-4o-2024-08-06") == 128000
    assert models.context_window_for("llama") == 1000


@pytest.mark.parametrize(
    ("text", "environ", "expected"),
    [
        ("server:\n  prot: 1\n", {}, "server.prot: unknown key"),
        ("serve:\n  port: 1\n", {}, "serve: unknown key"),
        ("server:\n  port: lots\n", {}, "server.port:"),
        ("upstream:\n  base_url: ftp://x\n", {}, "upstream.base_url: must be an http"),
        (
            "",
            {"COMPACTION_PROXY__UPSTREAM__ANTHROPIC_BASE_URL": "api.anthropic.com"},
            "upstream.anthropic_base_url: must be an http",
        ),
        ("compaction:\n  target_ratio: 0.9\n", {}, "compaction.target_ratio: must be below"),
        ("compaction:\n  trigger_ratio: 1.5\n", {}, "compaction.trigger_ratio:"),
        ("compaction:\n  trigger_tokens: 0\n", {}, "compaction.trigger_tokens:"),
        ("compaction:\n  precompute_ratio: 0.9\n", {}, "compaction.precompute_ratio: must not"),
        ("compaction:\n  keep_recent_rounds: 0\n", {}, "compaction.keep_recent_rounds:"),
        ("models:\n  context_windows:\n    m: -1\n", {}, "models.context_windows"),
        ("", {"COMPACTION_PROXY__SERVER__PORTT": "1"}, "server.portt: unknown key"),
        ("", {"COMPACTION_PROXY__UPSTREAM__TIMEOUT_S": "-1"}, "upstream.timeout_s:"),
        ("", {"COMPACTION_PROXY__SERVER": "1"}, "COMPACTION_PROXY__SERVER: expected"),
        ("[1, 2]\n", {}, "the top level must be a mapping"),
        ("server: [\n", {}, "not valid YAML"),
    ],
)
def test_bad_settings_name_the_key_and_the_reason_in_one_line(
    tmp_path: Path, text: str, environ: dict[str, str], expected: str
) -> None:
    with pytest.raises(SettingsError) as raised:
        load_settings(write(tmp_path, text), environ, {})
    message = str(raised.value)
    assert expected in message
    assert "\n" not in message


def test_a_missing_config_file_is_a_settings_error(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="cannot read"):
        load_settings(str(tmp_path / "nope.yaml"), {}, {})


def run_cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", *args],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), **(env or {})},
    )


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (("--config", "CFG"), {}, "server.prot: unknown key"),
        ((), {"COMPACTION_PROXY__UPSTREAM__BASE_URL": "not a url"}, "upstream.base_url"),
        (("--port", "70000"), {}, "server.port"),
        (("--upstream", "file:///etc/passwd"), {}, "upstream.base_url"),
    ],
)
def test_cli_exits_2_with_one_line_before_listening(
    tmp_path: Path, args: tuple[str, ...], env: dict[str, str], expected: str
) -> None:
    bad = tmp_path / "bad.yaml"  # not ./config.yaml, so only --config picks it up
    bad.write_text("server:\n  prot: 1\n")
    args = tuple(str(bad) if a == "CFG" else a for a in args)
    result = run_cli(*args, env=env, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("compaction-proxy: ") and expected in lines[0]
    assert result.stdout == ""
