"""The gate's metrics, one per kind of output: what the model is for, never one error over a
whole tensor. ``choice.py`` picks a metric per output (declared, else from the package kind and
the outputs) and ``judge`` scores a candidate output by output; the verdict (``verdict.py``)
says which metric judged each output and why. ``declared.py`` reads ``--metric``."""
