"""What a reviewer looks at, printed, never failed on: the modules past about 300 lines.

A long module may hold a second job; then it is split by responsibility. A module is never
split, nor code moved out of where it belongs, to get under a count. Run with `make review`.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LONG = 300


def long_modules(*packages: str) -> dict[str, int]:
    """Each module of `packages` past LONG lines, with its length, longest first."""
    lengths = {
        str(path.relative_to(REPO)): len(path.read_text(encoding="utf-8").splitlines())
        for package in packages
        for path in sorted((REPO / package).rglob("*.py"))
    }
    return dict(sorted(((n, c) for n, c in lengths.items() if c > LONG), key=lambda e: -e[1]))


def main() -> None:
    found = long_modules("proxy", "compaction")
    if not found:
        print(f"review: no module past {LONG} lines")
    for name, lines in found.items():
        print(f"review: {name} has {lines} lines: does it hold more than one job?")


if __name__ == "__main__":
    main()
