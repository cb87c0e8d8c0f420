"""What the proxy asks of and learns about the upstream's models.

- `discovery`: context windows read from the upstream (`models.discover`);
- `overflow`: an upstream's "prompt too long" answer recognised, and the window it teaches;
- `calibration`: the token estimate's factor per model, moved by the usage reported;
- `llm_client`: the library's ChatLLM over the configured upstream, in the request's dialect
  (the summarizer's client).

Imports nothing else of proxy/compacting/.
"""
