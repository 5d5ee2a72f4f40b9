"""A Hugging Face model and dataset for the built-in script (tests/test_usercode.py), no `loss` beside them:

    python examples/train.py --framework torch --model tests/user_hf.py:build --dataset tests/user_hf.py:load

`build(config)`: a small `transformers` GPT-2 (no downloaded weights); `load(config)`: (train, eval) torch Datasets
whose samples are dicts `{"input_ids", "labels"}` of a learnable sequence (each token the one before plus a step),
so the step calls `model(**batch)` and trains on the model's own loss.
"""
import numpy as np

VOCAB, LENGTH, SAMPLES = 32, 12, 384


def build(config):
    import transformers
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=LENGTH, n_embd=32, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0,
        loss_type="ForCausalLM"))


def load(config):
    import torch

    class Sequences(torch.utils.data.Dataset):
        def __init__(self, ids):
            self.ids = torch.from_numpy(ids)

        def __len__(self):
            return len(self.ids)

        def __getitem__(self, i):
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    rng = np.random.RandomState(3)
    start, step = rng.randint(0, VOCAB, (SAMPLES, 1)), rng.randint(1, 4, (SAMPLES, 1))
    ids = ((start + step * np.arange(LENGTH)) % VOCAB).astype(np.int64)
    cut = SAMPLES * 3 // 4
    return Sequences(ids[:cut]), Sequences(ids[cut:])
