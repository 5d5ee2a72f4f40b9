"""`toolkit export` for torch (toolkit/commands/export.py): a checkpoint's model as a safetensors file, the
state dict's names as the checkpoint keeps them (the plain module's, without DDP's `module.` or compile's
`_orig_mod.`), loadable with `safetensors.torch.load_file` + `model.load_state_dict(..., strict=True)`.
safetensors (Hugging Face's) is the format the field loads without pickle. A sharded checkpoint
(adapters/torch/sharded.py) is consolidated first, in this process, without a process group."""
from __future__ import annotations

from pathlib import Path

from toolkit.errors import ToolkitError

STATE_FILE = "state.pt"       # adapters/torch/session.py writes it


def export(folder: Path, out: Path, part: int, model_reference: str | None) -> int:
    """The `part`-th model of the checkpoint in `folder` written to `out`; the number of tensors."""
    import torch
    from safetensors.torch import save_file
    state = torch.load(folder / STATE_FILE, map_location="cpu", weights_only=True)
    if state.get("format") == "sharded":        # checkpoint_format sharded: consolidated here, no process group
        from toolkit.adapters.torch import sharded
        models = [p["model"] for p in sharded.whole(folder)]
    else:
        models = [state["model"], *(p["model"] for p in state.get("parts", []))]
    if part >= len(models):
        raise ToolkitError(f"--part {part}: {folder.name} holds {len(models)} model(s); give 0"
                           + (f" to {len(models) - 1}" if len(models) > 1 else ""))
    # each tensor its own contiguous copy: safetensors refuses tensors sharing memory (tied weights), and a
    # strict load wants every name back
    tensors = {name: value.detach().clone().contiguous() for name, value in models[part].items()}
    save_file(tensors, str(out), metadata={"format": "pt"})
    return len(tensors)
