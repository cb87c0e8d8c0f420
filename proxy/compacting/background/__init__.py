"""Work that runs beside the requests and never holds one up.

- `workers`: the processes a compaction's CPU work runs in;
- `flight`: single-flight, one computation for every caller that waits for it, as a tracked
  task (and across processes, under the state backend's lease);
- `archiving`: each compaction's folded turns archived;
- `reserve_writes`: the memory-file items of reserves, written when a reserve goes out;
- `dumps`: the debug dump of compacted requests.

Imports neither decision/, models/, fast/ nor the hook when it runs.
"""
