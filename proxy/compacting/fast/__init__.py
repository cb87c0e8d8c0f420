"""Speed machinery: what the plain design (parse the body, decide, serialize the view) does,
done faster on the body's bytes. The rest of the proxy enters through this package only
(`FastPath`, `parse_in_pieces`, and the `BodyIndexes` a caller may size or replace), so each
optimisation can be removed when a library catches up:

- `indexes`, `indexing`: a long conversation's last body remembered as an index (item offsets,
  prefix digests, token counts; built off the loop), and the next body recognized from it;
- `path`: `FastPath`, the recognized request answered from its index when the one decision
  (Conversations.decide, which reads the index as the request's history) needs no parse, and
  forwarded bodies spliced from the client's bytes;
- `pieces`: a large body parsed a megabyte at a time, the loop serving others in between;
- `parts`, `spans`: the byte-level scan of a JSON array and the splice of its items.
"""

from proxy.compacting.fast.indexes import BodyIndex, BodyIndexes
from proxy.compacting.fast.path import FastPath
from proxy.compacting.fast.pieces import parse_in_pieces

__all__ = ["BodyIndex", "BodyIndexes", "FastPath", "parse_in_pieces"]
