"""Anthropic Messages (`POST /v1/messages`): everything the proxy knows of this API's wire shape."""

from __future__ import annotations

from proxy.dialects.anthropic.dialect import ANTHROPIC_MESSAGES

__all__ = ["ANTHROPIC_MESSAGES"]
