"""`python -m proxy`: the same as the `compaction-proxy` console script."""

from __future__ import annotations

import sys

from proxy.cli import main

sys.exit(main())
