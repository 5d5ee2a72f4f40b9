"""`toolkit export CHECKPOINT OUT`: a checkpoint's model weights in the format OUT's suffix names, for the
framework's own loader in a process without the toolkit: `.safetensors` (torch, safetensors), `.keras` or
`.weights.h5` (Keras 3; the architecture from `--model pkg:build`), `.params` (MXNet Gluon). The checkpoint
is verified (its hashes) before anything is read; the framework's part is adapters/<framework>/export.py."""
from pathlib import Path

# OUT's suffix -> the framework whose checkpoint it exports (the longest suffix first)
FORMATS = {".weights.h5": "tensorflow", ".keras": "tensorflow", ".safetensors": "torch", ".params": "mxnet"}
# a checkpoint's file -> the framework that wrote it
WRITTEN_BY = {"state.pt": "torch", "weights.npz": "tensorflow", "model.params": "mxnet"}

EXAMPLES = """\
examples:
  toolkit export runs/ckpt model.safetensors                     # torch: the newest checkpoint's model
  toolkit export runs/ckpt/ckpt-00000120 model.safetensors       # that checkpoint
  toolkit export runs/ckpt model.keras --model mypkg.models:build    # Keras 3: the architecture from your build
  toolkit export runs/ckpt model.params                          # MXNet Gluon
  toolkit export runs/gan generator.safetensors --part 0         # several models: the first set up
"""


def register(sub) -> None:
    import argparse
    p = sub.add_parser("export", help="a checkpoint's model weights as .safetensors (torch), .keras / .weights.h5 "
                                      "(Keras 3) or .params (MXNet)",
                       epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", metavar="CHECKPOINT",
                   help="a ckpt-N folder, or a checkpoint_dir (its newest complete checkpoint)")
    p.add_argument("out", metavar="OUT", help="the file to write; its suffix is the format: " + ", ".join(FORMATS))
    p.add_argument("--model", default=None, metavar="PKG:BUILD",
                   help="Keras 3: the function that built the model (build(config), the config's `model`): a Keras "
                        "checkpoint holds the weights, the architecture comes from it")
    p.add_argument("--part", type=int, default=0, metavar="N",
                   help="several models in the checkpoint (a GAN): the N-th set up (default 0, the first)")
    p.set_defaults(func=run)


def run(args) -> int:
    from toolkit import registry
    from toolkit.errors import ToolkitError
    out = Path(args.out)
    wanted = next((fw for suffix, fw in FORMATS.items() if out.name.endswith(suffix)), None)
    if wanted is None:
        raise ToolkitError(f"export: {out.name}: the suffix names the format; one of {', '.join(FORMATS)}")
    folder = checkpoint_folder(Path(args.checkpoint))
    framework = next((fw for name, fw in WRITTEN_BY.items() if (folder / name).is_file()), None)
    if framework is None:
        raise ToolkitError(f"export: {folder} holds none of {', '.join(WRITTEN_BY)}: not a toolkit checkpoint")
    if framework != wanted:
        mine = ", ".join(suffix for suffix, fw in FORMATS.items() if fw == framework)
        raise ToolkitError(f"export: {out.name} is a {wanted} format, and {folder.name} is a {framework} checkpoint; "
                           f"name OUT with {mine}")
    if args.part < 0:
        raise ToolkitError(f"--part {args.part}: the index of a model in the checkpoint, 0 for the first")
    if framework == "tensorflow" and args.model is None:
        raise ToolkitError(f"export: {out.name}: a Keras checkpoint holds the weights only; give the architecture "
                           "with --model pkg.module:build (the function your training built the model with)")
    out.parent.mkdir(parents=True, exist_ok=True)
    if framework == "tensorflow":
        from toolkit.run import quiet
        quiet.filter_stderr()       # TensorFlow's start-up chatter off stderr, as in training
    tensors = registry.framework_module(framework, "export").export(folder, out, args.part, args.model)
    size = out.stat().st_size
    print(f"toolkit: export: {out} ({framework}, model {args.part} of {folder}: {tensors} tensors, "
          + (f"{size / 1e6:.1f} MB)" if size >= 1e6 else f"{size / 1e3:.0f} kB)"))
    return 0


def checkpoint_folder(path: Path) -> Path:
    """A `ckpt-N` folder as it is, or a checkpoint_dir's newest complete one; verified (every file's hash)."""
    from toolkit.errors import ToolkitError
    from toolkit.run import checkpoint
    if not path.is_dir():
        raise ToolkitError(f"export: {path}: no such folder; give a ckpt-N folder or the checkpoint_dir")
    if path.name.startswith(checkpoint.PREFIX):
        checkpoint.verify(path)
        return path
    if not checkpoint.all_checkpoints(path):
        raise ToolkitError(f"export: {path} holds no {checkpoint.PREFIX}N checkpoint; give a checkpoint_dir a run "
                           "saved into, or one of its ckpt-N folders")
    return checkpoint.latest(path)[0]
