"""Deciding per request and per conversation: the hook (`hook.CompactingHook`) that proxy.http
calls through proxy.interception, the conversations' checkpoints and summarizations, the
summarizer's client, calibration, cooldown, overflow retries and records.

`dialects/` will hold one module per API shape; `stores/` holds one module per checkpoint
state backend.
"""
