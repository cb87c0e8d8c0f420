"""Chat Completions (`POST /v1/chat/completions`): everything the proxy knows of this API's wire shape."""

from __future__ import annotations

from proxy.dialects.chat.dialect import CHAT_COMPLETIONS

__all__ = ["CHAT_COMPLETIONS"]
