"""Students of a text encoder (``--distill-layers``, ``--prune-heads``, ``--prune-ffn``): trained
into model folders (``shrink.py``, with ``distill.py`` and ``prune.py``) that the encoder
builder exports like the teacher, then every candidate timed for the Pareto choice
(``pareto.py``). docs/shrink.md."""
