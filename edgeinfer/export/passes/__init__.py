"""The stages every builder shares: source folder -> fp32 ONNX (``convert.py``), ONNX Runtime's
fusions (``optimize.py``), quantization by preset (``quantize.py``, every onnxruntime-version
workaround in ``ort_compat.py``), the PyTorch reference (``reference.py``) and the gate's
metrics through the runtime (``validate.py``)."""
