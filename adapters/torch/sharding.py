"""`sharding: zero1 | fsdp` on torch's native backend: what each rank keeps, and the checkpoint's whole state.

- zero1: torch's `ZeroRedundancyOptimizer` (the ZeRO stage-1 of Rajbhandari et al.) under DDP: the
  gradients are allreduced as without sharding; each rank keeps and updates the optimizer state of
  its share of the parameters only, then broadcasts its updated share.
- fsdp: FSDP2's `fully_shard` on each block (the elements of the model's ModuleLists: a transformer's
  layers; else its direct children that hold parameters), then on the model: each rank keeps 1/N of
  the parameters, gradients and optimizer state; parameters are all-gathered per block for the
  forward and backward passes, gradients reduce-scattered. precision bf16 is FSDP's own
  `MixedPrecisionPolicy` (bf16 parameters in the passes, gradients reduced in float32).

Checkpoints stay the toolkit's one format (adapters/torch/session.py `state.pt`: the model's and the
optimizer's state dicts, as unsharded training writes them), gathered with torch.distributed.checkpoint's
`get_model_state_dict` / `get_optimizer_state_dict` (full_state_dict, offloaded to rank 0's CPU) or
ZeRO's `consolidate_state_dict`, and given back with `set_model_state_dict` / `set_optimizer_state_dict`
(broadcast from rank 0) or ZeRO's `load_state_dict` (each rank takes its share): so a run can go from
fsdp to none to zero1 and back on the same checkpoints. The limit: the whole state passes through rank
0's host memory when saved or loaded; `checkpoint_format: sharded` (adapters/torch/sharded.py) has every
rank write and read its own shards instead.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from toolkit.adapters.torch.sharded import by_name, names
from toolkit.config import Precision, Sharding
from toolkit.errors import ToolkitError


def extra_bytes_per_value(config, size: int) -> float:
    """Bytes one rank hands to collectives per parameter value and step beyond the gradients' reduction:
    zero1's broadcast of this rank's updated share, fsdp's all-gathers of its parameter share (forward
    and backward; bf16 under its mixed-precision policy)."""
    if size == 1 or config.sharding is Sharding.NONE:
        return 0.0
    if config.sharding is Sharding.ZERO1:
        return 4 / size
    return 2 * (2 if config.precision is Precision.BF16 else 4) / size


@torch.no_grad()
def broadcast_module(module, root: int = 0) -> None:
    """Every parameter and buffer of a plain (unsharded) module from rank `root`, in place."""
    for tensor in module.state_dict().values():
        dist.broadcast(tensor, src=root)


def zero1(optimizer):
    """The user's optimizer as a ZeroRedundancyOptimizer of its class, its parameter groups and settings."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    groups = [dict(group) for group in optimizer.param_groups]
    if any(optimizer.state.values()):
        raise ToolkitError("sharding=zero1: the optimizer already has state (it stepped before setup); pass a "
                           "fresh optimizer to session.setup")
    first, *rest = groups
    zero = ZeroRedundancyOptimizer(first.pop("params"), optimizer_class=type(optimizer), **first)
    for group in rest:
        zero.add_param_group(group)
    return zero


def _blocks(model) -> list:
    """The modules fully_shard is applied to before the model itself: every element of its ModuleLists,
    else its direct children that hold parameters."""
    blocks = [m for lst in model.modules() if isinstance(lst, torch.nn.ModuleList) for m in lst]
    return blocks or [m for m in model.children() if any(True for _ in m.parameters())]


def fully_shard(session, strategy):
    """session.model sharded in place (rank 0's initial parameters first), and its optimizer remade over the
    sharded parameters (the same class, groups and settings)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from torch.distributed.fsdp import fully_shard as shard
    model, optimizer = session.model, session.optimizer
    if any(optimizer.state.values()):
        raise ToolkitError("sharding=fsdp: the optimizer already has state (it stepped before setup); pass a "
                           "fresh optimizer to session.setup")
    broadcast_module(model)     # every rank starts from rank 0's model, as DDP's constructor does
    name_of = {id(p): n for n, p in model.named_parameters()}
    groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [name_of[id(p)] for p in g["params"]]}
              for g in optimizer.param_groups]
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if session.config.precision is Precision.BF16 else MixedPrecisionPolicy()
    for block in _blocks(model):
        shard(block, mp_policy=policy)
    shard(model, mp_policy=policy)
    params = dict(model.named_parameters())
    remade = type(optimizer)([{**g, "params": [params[n] for n in g["params"]]} for g in groups])
    return model, remade


def full_state(part, strategy) -> dict:
    """{"model", "optimizer"}: the whole state as unsharded training saves it; a collective, the
    optimizer's only on rank 0 for zero1 (consolidated there)."""
    if strategy.sharding is Sharding.ZERO1:
        part.optimizer.consolidate_state_dict(to=0)
        return {"model": strategy.unwrap(part.model).state_dict(),
                "optimizer": part.optimizer.state_dict() if strategy.rank == 0 else None}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    optimizer = get_optimizer_state_dict(part.model, part.optimizer, options=options)
    return {"model": get_model_state_dict(part.model, options=options),
            "optimizer": by_name(optimizer, names(part, strategy), to_names=False) if optimizer else None}


def broadcast(session, strategy, stash: dict | None) -> None:
    """A checkpoint read on rank 0 (`stash`) into every rank's shards; nothing at setup (the ranks started
    from rank 0's model and have no optimizer state yet)."""
    loading = strategy.broadcast_object(stash is not None, name="toolkit.sharded_resume") if strategy.size > 1 \
        else stash is not None
    if not loading:
        return
    part = session.part
    if strategy.sharding is Sharding.ZERO1:
        model = strategy.unwrap(part.model)
        if stash is not None:
            model.load_state_dict(stash["model"])
        broadcast_module(model)
        optimizer_state = strategy.broadcast_object(stash["optimizer"] if stash else None,
                                                    name="toolkit.zero1_optimizer")
        part.optimizer.load_state_dict(optimizer_state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(part.model, stash["model"] if stash else {}, options=options)
    optimizer = by_name(stash["optimizer"], names(part, strategy), to_names=True) if stash else {}
    set_optimizer_state_dict(part.model, part.optimizer, optimizer, options=options)
