"""`checkpoint_format: sharded`: the models' and optimizers' state through torch.distributed.checkpoint (DCP).

A sharded checkpoint is the same atomic, hashed `ckpt-<step>/` folder as a single one (toolkit/run/checkpoint.py);
it holds DCP's files (`.metadata`, one `__<rank>_0.distcp` per writing rank) with

    {"part0": {"model": the model's state dict, "optimizer": its optimizer's state by parameter name}, "part1": ...}

(the names are the plain module's, as `state.pt` has them; the optimizer's as DCP's `get_state_dict` gives them),
and `state.pt` with {"format": "sharded", "models": their number, the precision's state (fp16's loss scale)}.

- **torch.distributed (the native backend)**: every rank writes its own shards (FSDP2's DTensors: its share;
  DDP's replicated tensors: DCP writes each once) and reads back what its own layout needs, so a checkpoint
  resumes on any number of ranks and any sharding (fsdp -> none, 2 -> 3 -> 1 ranks): DCP reshards.
  `get_state_dict` creates an empty optimizer's state first (a step on zero gradients at learning rate 0, which
  leaves the parameters as they are); the load then overwrites it.
- **Horovod, ZeRO and a single process** (no torch.distributed process group, or ZeRO's own split): rank 0
  writes the whole state as DCP files (`no_dist`) and reads one back whole without a process group (DCP's
  `dcp_to_torch_save`), then the strategy's broadcast shares it as for a single checkpoint.

The loaders' positions, the exchange's residuals and the random generators stay in the files rank 0 writes for
every format (adapters/checkpointer.py).
"""
from __future__ import annotations

import contextlib
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from toolkit.adapters.torch import staging
from toolkit.config import Sharding
from toolkit.errors import ToolkitError

FORMAT = "sharded"


def every_rank(strategy) -> bool:
    """True where every rank writes and reads its own shards: a torch.distributed process group (native), but
    not under ZeRO (its optimizer shards follow its own parameter split: rank 0 reads the state whole and ZeRO's
    broadcast shares it, adapters/torch/sharding.py)."""
    return (strategy.name == "native" and getattr(strategy, "sharding", None) is not Sharding.ZERO1
            and dist.is_available() and dist.is_initialized())


def names(part, strategy) -> list[list[str]]:
    """Each optimizer group's parameter names (the plain module's), in the group's order."""
    name_of = {id(p): n for n, p in strategy.unwrap(part.model).named_parameters()}
    return [[name_of[id(p)] for p in group["params"]] for group in part.optimizer.param_groups]


def by_name(state: dict, names: list[list[str]], to_names: bool) -> dict:
    """An optimizer state dict re-keyed: torch's own (parameters numbered in group order) to
    torch.distributed.checkpoint's (parameters by name; `to_names`), or back."""
    flat = [n for group in names for n in group]
    old_to_new = dict(enumerate(flat)) if to_names else {n: i for i, n in enumerate(flat)}
    return {"state": {old_to_new[k]: v for k, v in state["state"].items()},
            "param_groups": [{**g, "params": [old_to_new[k] for k in g["params"]]} for g in state["param_groups"]]}


def _states(parts, strategy) -> dict:
    """This rank's {"part<i>": {"model", "optimizer"}} as DCP's state-dict API gives them (sharded where the
    parameters are)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict
    out = {}
    for i, part in enumerate(parts):
        model, optimizer = get_state_dict(strategy.unwrap(part.model), part.optimizer)
        out[f"part{i}"] = {"model": model, "optimizer": optimizer}
    return out


def _failed(folder: Path, verb: str, e: Exception) -> ToolkitError:
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return ToolkitError(f"checkpoint {folder}: torch.distributed.checkpoint could not {verb} the shards "
                        f"({e.__class__.__name__}: {first})")


def save(parts, strategy, folder: Path) -> None:
    """Collective (every rank): each rank's shards into `folder`."""
    import torch.distributed.checkpoint as dcp
    try:
        dcp.save(_states(parts, strategy), checkpoint_id=str(folder))
    except Exception as e:      # DCP raises the same CheckpointException on every rank
        raise _failed(folder, "write", e) from None


def load(parts, strategy, folder: Path) -> None:
    """Collective (every rank): each rank's shards of every part from `folder`, resharded to this job's layout."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict
    states = _states(parts, strategy)
    try:
        dcp.load(states, checkpoint_id=str(folder))
    except Exception as e:
        raise _failed(folder, "read", e) from None
    for i, part in enumerate(parts):
        state = states[f"part{i}"]
        set_state_dict(strategy.unwrap(part.model), part.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"])


def save_async(parts, strategy, folder: Path):
    """Collective (every rank): each rank's shards copied to host memory now, written into `folder` by DCP's
    `async_save` in a thread while training goes on; returns what waits for the write (its error one line). The
    write's collectives run in a Gloo group of their own, made at the first such save, so they never interleave
    with training's."""
    import torch.distributed.checkpoint as dcp
    global _GROUP
    if _GROUP is None:
        _GROUP = dist.new_group(backend="gloo")
    future: Any = dcp.async_save(_states(parts, strategy), checkpoint_id=str(folder), process_group=_GROUP,
                                 async_stager=staging.dcp_stager())

    def wait() -> None:
        try:
            future.result()
        except Exception as e:
            raise _failed(folder, "write", e) from None
    return wait


_GROUP: Any = None      # save_async's process group


@contextlib.contextmanager
def _one_process():
    """DCP without a process group (`no_dist`) warns on every call that it assumes one process: it is meant."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def save_whole(whole: list[dict], names_: list[list[list[str]]], folder: Path) -> None:
    """Rank 0 alone (no process group): the parts' whole states (`strategy.full_state`'s; `names_`: each part's
    `names`) as DCP files."""
    import torch.distributed.checkpoint as dcp
    states = {f"part{i}": {"model": state["model"], "optimizer": by_name(state["optimizer"], n, to_names=True)}
              for i, (state, n) in enumerate(zip(whole, names_))}
    try:
        with _one_process():
            dcp.save(states, checkpoint_id=str(folder), no_dist=True)
    except Exception as e:
        raise _failed(folder, "write", e) from None


def whole(folder: Path) -> list[dict]:
    """A sharded checkpoint written on any number of ranks, consolidated in this process without a process group:
    each part's {"model", "optimizer" (by parameter name)}, plain tensors on the CPU."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    with tempfile.TemporaryDirectory(prefix="toolkit-consolidate-") as tmp:
        with _one_process():
            dcp_to_torch_save(str(folder), Path(tmp) / "whole.pt")
        states = torch.load(Path(tmp) / "whole.pt", map_location="cpu", weights_only=True)
    return [states[f"part{i}"] for i in range(len(states))]


def load_whole(parts, strategy, folder: Path) -> list[dict]:
    """Rank 0 alone: every part's whole state as torch's own state dicts (`whole`)."""
    states = whole(folder)
    return [{"model": states[i]["model"],
             "optimizer": by_name(states[i]["optimizer"], names(part, strategy), to_names=False)}
            for i, part in enumerate(parts)]
