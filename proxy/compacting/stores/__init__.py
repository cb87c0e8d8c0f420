"""State backends: where checkpoints, summarizer cooldowns, single-flight leases, forwarded marks
and memory-file item claims live (`state.backend`), one module per backend.

- roles: the protocols each consumer receives (one role each) and StateBackend, all of them;
- factory: `build_backend`, the one place a backend is chosen from settings;
- local: the process only (and the in-process cache behind the others);
- sqlite (+ sqlite_file): one file that outlives the process (the default);
- redis (+ redis_scripts, redis_notices): shared by replicas;
- guard: keeps a persistent or shared backend's outages away from requests.
"""
