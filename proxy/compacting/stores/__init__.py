"""State backends: where checkpoints, summarizer cooldowns, single-flight leases and memory-item
claims live (`state.backend`), one module per backend.

- backend: the StateBackend protocol (a compaction.checkpoints.CheckpointStore and more) and
  `build_backend`, the one place a backend is chosen from settings;
- memory: the process only (and the in-process cache behind the others);
- sqlite (+ sqlite_file): one file that outlives the process (the default);
- redis (+ redis_scripts, redis_notices): shared by replicas;
- guard: keeps a persistent or shared backend's outages away from requests.
"""
