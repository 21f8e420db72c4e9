"""Image classifiers from PyTorch (the ``vision`` builder, ``builder.py``): how a package
resizes and normalizes pictures (``preprocessing.py``) and the networks written here for
weights that ship without their code (``archs/``). docs/vision.md."""
