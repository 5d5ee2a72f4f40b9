"""`toolkit export` for MXNet (toolkit/commands/export.py): the checkpoint's parameters file is Gluon's own
(`save_parameters`), copied as it is and read back with MXNet's loader to prove it; a user loads it with
`net.load_parameters(path)`."""
from __future__ import annotations

import shutil
from pathlib import Path

from toolkit.errors import ToolkitError


def export(folder: Path, out: Path, part: int, model_reference: str | None) -> int:
    """The `part`-th model of the checkpoint in `folder` written to `out`; the number of parameters."""
    import toolkit.shims.toolkit_numpy_compat  # noqa: F401  numpy.bool for MXNet on numpy 1.26, before `import mxnet`

    # isort: split
    import mxnet as mx
    saved = sorted(folder.glob("model*.params"))
    name = "model.params" if part == 0 else f"model{part}.params"    # adapters/mxnet/session.py's part_files
    if not (folder / name).is_file():
        raise ToolkitError(f"--part {part}: {folder.name} holds {len(saved)} model(s); give 0"
                           + (f" to {len(saved) - 1}" if len(saved) > 1 else ""))
    shutil.copyfile(folder / name, out)
    return len(mx.nd.load(str(out)))
