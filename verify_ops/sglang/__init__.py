"""SGLang integration: the ``verify_ops`` attention backend (``backend.py``), its
plugin entry point (``plugin.py``), and the defrag hooks that keep each
request's KV contiguous (``defrag.py``). ``config.py`` holds the names and
settings they share."""
