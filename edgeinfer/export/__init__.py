"""The workstation side: torch, transformers, optimum and onnx are allowed here and only here."""
