"""A user's ONNX file as a package (the ``onnx-file`` builder, ``builder.py``): the graph
checked and described (``user_graph.py``) and what each form of graph needs (``forms.py``:
images, token ids, raw tensors with state). docs/onnx.md."""
