"""Admin: what the proxy shows of itself, over the session records it keeps.

- records: the session records (counters, compaction records, timelines) and their documents;
- routes: the admin endpoints (/admin/sessions...), behind `admin.token`;
- dashboard: the page at /admin/ (static/: its page, script and style as package data) and the
  JSON it reads under /admin/api/;
- inspect: `compaction-proxy inspect`, the dashboard's views in a terminal, read from a running
  proxy's /admin/api/.

It reads the records and the memory file, never a response header, and knows nothing of how a
request is compacted (proxy.compacting, proxy.recall): tests/test_architecture.py keeps it so.
"""
