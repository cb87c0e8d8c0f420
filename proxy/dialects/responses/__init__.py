"""The Responses API (`POST /v1/responses`): everything the proxy knows of this API's wire shape."""

from __future__ import annotations

from proxy.dialects.responses.dialect import RESPONSES_API

__all__ = ["RESPONSES_API"]
