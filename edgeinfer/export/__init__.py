"""The workstation side: torch, transformers, optimum and onnx are allowed here and only here.

``run.export(ExportOptions(source=..., out=...))`` runs one export with the builder the source
calls for (``registry.py``: one folder per kind, ``encoder/``, ``decoder/``, ``early_exit/``,
``vision/``, ``onnx_file/``; the stages they share in ``passes/``, their data in ``data/``);
builtins are recipes in ``models/`` (``recipes.py``). docs/architecture.md draws the tree. This
package module imports nothing, so that importing one export module never loads the others.
"""
