"""The caches in front of a model's graph: the exact result cache (``results.py``: memory, then
SQLite, ``stores.py``), the semantic cache (``semantic.py``) and the tiers a text call tries in
order (``tiers.py``). docs/cache.md."""
