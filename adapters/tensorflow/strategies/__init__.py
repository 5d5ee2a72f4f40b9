"""How gradients and state move for TensorFlow: one module per backend (adapters/strategy.py):
horovod (Keras 3 on horovod.tensorflow), tf_keras (Horovod's own horovod.tensorflow.keras), native
(TensorFlow's MirroredStrategy / MultiWorkerMirroredStrategy)."""
