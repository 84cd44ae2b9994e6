"""SGLang integration: the ``verify_ops`` attention backend, its plugin entry point,
and the defrag hooks that keep each request's KV contiguous (``defrag.py``)."""
