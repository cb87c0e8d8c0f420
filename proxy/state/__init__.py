"""The state: everything the proxy keeps beyond a request, in one layer (`state.backend`).

One SQLite connection policy (proxy.state.sqlite_file: the file opened once per process, one
thread, WAL) or one Redis client (proxy.state.redis_client) per process, and each consumer handed
its role over it:

- roles: the protocols each consumer receives (checkpoints, leases, cooldowns, forwarded marks,
  item claims, bound models) and StateBackend, all of them; the archive's role is
  archive.entries.Archive;
- factory: `build_state`, the one place a backend is chosen and built from settings (`State`:
  the backend and the archive over one file or client), and `build_reader` for the command line;
- local: the process only (and the in-process cache behind the others);
- sqlite (+ sqlite_file): one file that outlives the process (the default);
- redis (+ redis_client, redis_scripts, redis_notices): shared by replicas;
- cooldown: the summarizer's cooldowns per key, which every backend keeps the same way;
- guard: keeps a persistent or shared backend's outages away from requests;
- archive/: folded turns kept verbatim and searched (entries, terms, one module per backend,
  the memory file's items, one search over both).

It imports the library, settings, metrics and tasks; never http/, compacting/ or recall/.
"""
