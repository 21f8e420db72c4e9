"""Decoder LLMs (the ``decoder`` builder, ``builder.py``): the graph written from the weights
with ONNX Runtime's fused decoder ops (``graph.py``, what differs per family in
``families.py``), the quantized variants and their gates (``variants.py``, with the 8-bit
embedding ``embed.py`` and the refined lm_head ``head.py``), the PyTorch source and its quality
measures (``lm.py``), the package's chat format (``chat_template.py``) and GGUF tokenizers
(``gguf_tokenizer.py``). docs/generation.md."""
