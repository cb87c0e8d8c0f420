"""The user documentation stays short where it must and complete where it must.

- README.md is for users: at most 300 lines; the reference lives in docs/.
- docs/configuration.md documents every key of every `Settings` section, with its environment
  variable.
- docs/ names every route `create_app` registers, and docs/operations.md every metric `/metrics`
  serves.
- Every relative link of README.md and docs/ points at a file that exists, and at a heading of it.
"""

from __future__ import annotations

import re
from pathlib import Path

from aiohttp import web
from prometheus_client.metrics_core import Metric
from pydantic import BaseModel

from proxy.app import create_app
from proxy.metrics import Metrics
from proxy.settings import ENV_PREFIX, Settings

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
README_MAX_LINES = 300


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _docs_text() -> str:
    return "\n".join(_read(path) for path in sorted(DOCS.glob("*.md")))


def _settings_keys() -> list[tuple[str, str]]:
    keys = []
    for section, field in Settings.model_fields.items():
        model = field.annotation
        assert isinstance(model, type) and issubclass(model, BaseModel), section
        keys += [(section, key) for key in model.model_fields]
    return keys


def _route_paths(app: web.Application) -> set[str]:
    """The path of every route, as docs write it (`/v1/{tail}`); the catch-all (indexed
    under `/`, answering every target) is the only one without a path of its own."""
    paths = set()
    for resource in app.router.resources():
        info = resource.get_info()
        path = info.get("formatter") or info.get("path")
        if path and path != "/":
            paths.add(path)
    return paths


def _metric_names(metric: Metric) -> str:
    # prometheus-client keeps a counter's family name without `_total`; the wire has it.
    return f"{metric.name}_total" if metric.type == "counter" else metric.name


def _names(text: str, path: str) -> bool:
    """True when `text` has `path` as a whole path: `/admin/sessions` is not found inside
    `/admin/sessions/{session}`, nor `/v1/responses` inside `/s/{session}/v1/responses`."""
    return re.search(rf"(?<![\w/}}]){re.escape(path)}(?![\w/{{])", text) is not None


def test_readme_is_at_most_three_hundred_lines() -> None:
    lines = len(_read(REPO / "README.md").splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move reference to docs/"


def test_every_settings_key_is_in_the_configuration_reference() -> None:
    reference = _read(DOCS / "configuration.md")
    missing = [
        f"{section}.{key}"
        for section, key in _settings_keys()
        if f"`{section}.{key}`" not in reference
        or f"`{ENV_PREFIX}{section.upper()}__{key.upper()}`" not in reference
    ]
    assert _settings_keys(), "no settings found"
    assert not missing, f"docs/configuration.md lacks (key or environment variable): {missing}"


def test_every_route_is_documented() -> None:
    app = create_app(Settings.build({"state": {"backend": "memory"}}))
    paths = _route_paths(app)
    assert "/v1/chat/completions" in paths
    docs = _docs_text()
    missing = sorted(path for path in paths if not _names(docs, path))
    assert not missing, f"routes of create_app missing from docs/: {missing}"


def test_every_metric_is_in_the_operations_guide() -> None:
    names = {_metric_names(metric) for metric in Metrics().registry.collect()}
    assert "compaction_proxy_requests_total" in names
    guide = _read(DOCS / "operations.md")
    missing = sorted(name for name in names if f"`{name}`" not in guide)
    assert not missing, f"metrics missing from docs/operations.md: {missing}"


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the headings of `page`."""
    headings = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", _read(page), flags=re.S), re.M)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def test_every_relative_link_resolves() -> None:
    broken = []
    for page in [REPO / "README.md", *sorted(DOCS.glob("*.md"))]:
        for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", _read(page)):
            if "://" in target:
                continue
            linked = page.parent / target if target else page
            if not linked.is_file() or (anchor and anchor not in _anchors(linked)):
                broken.append(f"{page.relative_to(REPO)} -> {target}#{anchor}")
    assert not broken, f"broken links: {broken}"
