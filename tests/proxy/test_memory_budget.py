"""One memory budget: every in-process cache is bounded by a setting (docs/operations.md sums
them up), and the bounds the settings name are the ones the running proxy uses."""

from __future__ import annotations

from proxy.compacting.calibration import Calibration
from proxy.compacting.overflow import LearnedWindows
from proxy.settings import load_settings


def test_the_new_bounds_have_safe_defaults_and_come_from_the_environment() -> None:
    defaults = load_settings(None, {}, {})
    assert defaults.models.max_models == 1024
    assert defaults.memory.max_sessions == 4096
    env = {
        "COMPACTION_PROXY__MODELS__MAX_MODELS": "8",
        "COMPACTION_PROXY__MEMORY__MAX_SESSIONS": "16",
    }
    tuned = load_settings(None, env, {})
    assert (tuned.models.max_models, tuned.memory.max_sessions) == (8, 16)


def test_calibration_keeps_at_most_max_models() -> None:
    calibration = Calibration(max_models=2)  # create_app passes models.max_models
    for model in ("a", "b", "c"):
        calibration.observe(model, 1000, 1500)
    assert calibration.factor("a") == 1.0  # forgotten: the least recently used
    assert calibration.factor("b") == calibration.factor("c") == 1.5


def test_learned_windows_keep_at_most_max_models() -> None:
    learned = LearnedWindows(max_models=2)  # create_app passes models.max_models
    for model in ("a", "b", "c"):
        learned.learn(model, 8000, 128_000)
    assert learned.window("a", 128_000) == 128_000  # forgotten
    assert learned.window("c", 128_000) == 8000


def test_calibration_alone_keeps_its_default_bound() -> None:
    calibration = Calibration()
    for number in range(1030):
        calibration.observe(f"m{number}", 1000, 1200)
    assert calibration.factor("m0") == 1.0 and calibration.factor("m1029") == 1.2
