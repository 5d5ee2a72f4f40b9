"""One module per framework (`torch.py`, ...), each implementing `adapters.base.Adapter`.

Imported only through `toolkit.registry`, when its framework is chosen.
"""
