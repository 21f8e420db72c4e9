"""Text encoders, embeddings and classifiers (the ``encoder`` builder, ``builder.py``), and the
smaller students it can train from them (``students/``). docs/export.md, docs/shrink.md."""
