"""Checkpoint stores: one module per state backend, each implementing
compaction.checkpoints.CheckpointStore (async `longest(digests)` and `put(checkpoint)`).

`memory` keeps them in the process. A persistent or shared backend (sqlite, redis) stores
`Checkpoint.to_json()` under the key and reads back with `Checkpoint.from_json`, a ValueError
being a miss; `app.create_app(settings, store=...)` takes any of them.
"""
