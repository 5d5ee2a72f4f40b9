"""PyTorch: the session (`session.py`, Horovod's torch API) and the built-in models (`models.py`).

Imported only when framework=torch is chosen (toolkit.registry), so `import toolkit` stays light.
"""
