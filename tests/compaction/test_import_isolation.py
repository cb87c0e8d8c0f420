"""The library imports without the HTTP layer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_importing_compaction_loads_neither_aiohttp_nor_proxy() -> None:
    probe = (
        "import sys, compaction, compaction.engine\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('aiohttp', 'proxy'))\n"
        "print(','.join(bad))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    assert done.stdout.strip() == ""
