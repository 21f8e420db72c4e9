"""Calibration and evaluation inputs, never the same samples for both: text (``text.py``: the
BBC News articles or a user's file), labelled topics (``topics.py``), photos (``photos.py``),
digits (``digits.py``) and raw tensor streams (``tensors.py``)."""
