"""The semantic channel's embedder: the port (``port``) and the local model behind it
(``onnx_minilm``, ``model``). Services see the port only; the composition root loads the model."""
