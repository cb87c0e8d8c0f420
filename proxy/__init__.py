"""proxy: the service. `http/` moves requests, `compacting/` decides what to send (through the
protocol in `hook.py`); the top-level modules build and run the app."""
