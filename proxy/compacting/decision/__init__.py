"""What one request goes out with, and when a conversation's compaction starts.

- `request`: a request as the hook sees it, parsed once by its dialect, with its budget;
  `identity`: the session a client names in its body;
- `history`: a request's history as the decision reads it, and what a view is estimated at;
- `conversations`: the compactions of every conversation and the one decision
  (`Conversations.decide`); `applied`: the compactions some request already went out with;
  `fallback`: what a request that stopped waiting for its summary goes out with;
- `precompute`: preparing a conversation's next checkpoint before a request needs it (it runs
  after a request, but decides with the conversations, so it lives beside them);
- `exchange`: one compacted request from the upstream's side: the retry after a context-length
  error, calibration from the reported usage;
- `records`: each compaction counted, recorded for /admin and logged once;
- `thinking`: which thinking blocks a compacted request may send back to a model that binds
  them to their prefix (preserved thinking).

Imports background/ and models/, never the hook or fast/.
"""
