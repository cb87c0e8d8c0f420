"""A response's `usage` object as the dialects read it: found in a document (at its top level
or in the field a dialect holds it in), and summed over the rounds of one request."""

from __future__ import annotations

from collections.abc import Iterable

from proxy.dialects.base import JsonObject


def find_usage(document: object, holders: Iterable[str]) -> JsonObject | None:
    """`usage` of a document, or of the first of its `holders` fields that has one."""
    if not isinstance(document, dict):
        return None
    for holder in (document, *(document.get(name) for name in holders)):
        usage = holder.get("usage") if isinstance(holder, dict) else None
        if isinstance(usage, dict):
            return usage
    return None


def add_usage(total: object, more: object) -> object:
    """Two `usage` objects summed field by field (nested details included); a field only one
    has is kept as it is."""
    if not isinstance(total, dict) or not isinstance(more, dict):
        return total if more is None else more if total is None else total
    summed = dict(total)
    for key, value in more.items():
        mine = summed.get(key)
        if isinstance(value, int) and isinstance(mine, int) and not isinstance(value, bool):
            summed[key] = mine + value
        elif isinstance(value, dict) and isinstance(mine, dict):
            summed[key] = add_usage(mine, value)
        elif key not in summed:
            summed[key] = value
    return summed


def counted(usage: object, key: str) -> int:
    """An integer field of `usage`, 0 when it has none."""
    value = usage.get(key, 0) if isinstance(usage, dict) else 0
    return value if isinstance(value, int) else 0
