"""SGLang integration: the ``verify_ops`` attention backend and its plugin entry point."""
