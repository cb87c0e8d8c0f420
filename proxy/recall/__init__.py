"""The `recall` tool: a compacted request carries it, and the proxy answers the model's calls to
it from the session's archive and memory items, then calls the upstream again; the client never
sees a recall call.

- tools: the tool (each dialect declares it in its shape), and a compacted body equipped with it
  (the tool after the client's tools, fixed bytes; the summary's recall line);
- answers: a call's arguments read as a query, searched in the request's own session and
  credential, rendered best first and clipped to the room left in the window;
- rounds: the rounds of one request (a proxy.interception.Followup), reading each response
  through the request's dialect (its calls, whole or streamed, taken out or answered into the
  request: proxy.dialects);
- equipping: which compacted requests carry the tool (`Recall`, built once per app).
"""

from __future__ import annotations

from proxy.recall.equipping import Recall
from proxy.recall.rounds import RecallRounds
from proxy.recall.tools import NAME

__all__ = ["NAME", "Recall", "RecallRounds"]
