"""`toolkit export` for Keras 3 (toolkit/commands/export.py): a Keras checkpoint holds the model's weights
(weights.npz, `get_weights()` order); the architecture comes from the user's `build(config)` (the config's
`model: pkg:build`), the weights go into it, and Keras writes its own format: `.keras` (the whole model,
`keras.saving.load_model`) or `.weights.h5` (`model.load_weights` into the same architecture)."""
from __future__ import annotations

from pathlib import Path

from toolkit.errors import ToolkitError


def export(folder: Path, out: Path, part: int, model_reference: str | None) -> int:
    """The `part`-th model of the checkpoint in `folder` written to `out`; the number of weight arrays."""
    import keras

    from toolkit import config, usercode
    from toolkit.adapters.tensorflow.keras import load_arrays, part_files
    weights = folder / part_files(part)[0]
    if not weights.is_file():
        saved = len(list(folder.glob("weights*.npz")))
        raise ToolkitError(f"--part {part}: {folder.name} holds {saved} model(s); give 0"
                           + (f" to {saved - 1}" if saved > 1 else ""))
    model = usercode.resolve("--model", model_reference or "")(config.load(None, framework="tensorflow"))
    if not isinstance(model, keras.Model):
        raise ToolkitError(f"--model {model_reference}: build(config) returned a {type(model).__name__}, expected a "
                           "Keras 3 model (.keras and .weights.h5 are Keras 3's formats)")
    arrays = load_arrays(weights)
    if len(arrays) != len(model.weights):
        raise ToolkitError(f"--model {model_reference}: its model has {len(model.weights)} weight arrays, "
                           f"{weights.name} holds {len(arrays)}; give the build the checkpoint was trained with")
    model.set_weights(arrays)
    if out.name.endswith(".weights.h5"):
        model.save_weights(str(out))
    else:
        model.save(str(out))
    return len(arrays)
