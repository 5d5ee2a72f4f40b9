"""MXNet Gluon: the session (`session.py`, Horovod's DistributedTrainer) and the built-in models
(`models.py`). MXNet 1.9.1 is the last release (retired upstream).

Imported only when framework=mxnet is chosen (toolkit.registry), so `import toolkit` stays light.
"""
