"""One class per package kind, each a ``Model`` with its own calls: ``embed.py``
(``EmbedModel``), ``classify.py`` (``ClassifyModel``: texts, images, early exit), ``detect.py``
(``DetectModel``), ``segment.py`` (``SegmentModel``), ``raw.py`` (``RawModel``),
``generate.py`` (``GenerateModel`` over ``runtime/generate/``); what kinds share beside them:
the text hot path (``text.py``), pictures as callers hold them (``pictures.py``), exit
segments and their curve (``early_exit.py``, ``exit_curve.py``)."""
