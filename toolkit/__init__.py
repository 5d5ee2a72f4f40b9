"""toolkit: Horovod that works today, for PyTorch, TensorFlow/Keras 3 and MXNet.

`import toolkit` imports no framework; adapters are imported by name only when chosen.
"""
__version__ = "0.1.0"
