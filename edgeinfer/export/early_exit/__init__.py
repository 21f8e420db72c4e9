"""Early-exit classifiers exported as segments with exit heads: text heads on a frozen encoder
(``text.py``, the ``exit-heads`` builder), a digits CNN (``cnn.py``, ``exit-cnn``), and what
both share (``segments.py``: candidates, the gate, the exit-rule calibration on the curve of
``runtime/exit_curve.py``). docs/early_exit.md."""
