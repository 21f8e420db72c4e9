"""The workstation side: torch, transformers, optimum and onnx are allowed here and only here.

``run.export(ExportOptions(source=..., out=...))`` runs one export with the builder the source
calls for (``builders/``); builtins are recipes in ``models/`` (``recipes.py``). This package
module imports nothing, so that importing one export module never loads the others.
"""
