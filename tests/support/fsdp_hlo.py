"""A hand-written step with one sharded parameter: its gradient all-reduced, then sliced to this device's
block by ``offsets[partition-id]`` as XLA:CPU's SPMD partitioner writes a reduce-scatter."""

from __future__ import annotations


def fsdp_text(*, p: int = 4, n_groups: int = 1, dim: int = 1, shard=(3, 2), positions=None, interleaved=False,
              block=None, extra_user: bool = False, blocks: int | None = None) -> str:
    """A step with one parameter shard ``p_`` (``shard``) whose gradient (``blocks`` times it along ``dim``,
    ``p`` by default) is all-reduced over ``n_groups`` groups of ``p`` devices and sliced by
    ``offsets[partition-id]``; ``positions[i]`` is the block the ``i``-th device of each group gets (its
    position by default), ``block`` the slice's size along ``dim`` (the shard's by default). With
    ``blocks=4, p=8, positions=[0, 1, 2, 3] * 2`` it is a data x fsdp mesh's gradient scatter: reduced
    over all 8 devices, sliced by the fsdp position."""
    full = [s * (blocks or p) if i == dim else s for i, s in enumerate(shard)]
    size = list(shard)
    if block is not None:
        size[dim] = block
    n = p * n_groups
    groups = ([[g + k * n_groups for k in range(p)] for g in range(n_groups)] if interleaved
              else [[g * p + k for k in range(p)] for g in range(n_groups)])
    positions = list(range(p)) if positions is None else positions
    table = [0] * n
    for g in groups:
        for i, d in enumerate(g):
            table[d] = positions[i] * size[dim]
    f = lambda dims: f"f32[{','.join(map(str, dims))}]"  # noqa: E731
    offsets = ", ".join("%off" if i == dim else "%zero" for i in range(len(shard)))
    rg = "{" + ",".join("{" + ",".join(map(str, g)) + "}" for g in groups) + "}"
    user = f"  %extra = {f(full)} negate(%ar)\n" if extra_user else ""
    root_extra = ", %extra" if extra_user else ""
    root_shape = f"({f(size)}, f32[]{', ' + f(full) if extra_user else ''})"
    return f"""HloModule fsdp, entry_computation_layout={{({f(shard)}, {f(full)})->{root_shape}}}

%add (a: f32[], b: f32[]) -> f32[] {{
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}}

ENTRY %main (p_: {f(shard)}, x: {f(full)}) -> {root_shape} {{
  %p_ = {f(shard)} parameter(0)
  %x = {f(full)} parameter(1)
  %g = {f(full)} multiply(%x, %x)
  %ar = {f(full)} all-reduce(%g), channel_id=1, replica_groups={rg}, use_global_device_ids=true, to_apply=%add
{user}  %table = s32[{n}] constant({{{', '.join(map(str, table))}}})
  %pid = u32[] partition-id()
  %pick = s32[1] dynamic-slice(%table, %pid), dynamic_slice_sizes={{1}}
  %off = s32[] reshape(%pick)
  %zero = s32[] constant(0)
  %slice = {f(size)} dynamic-slice(%ar, {offsets}), dynamic_slice_sizes={{{','.join(map(str, size))}}}
  %new = {f(size)} subtract(%p_, %slice)
  %fzero = f32[] constant(0)
  %l = f32[] reduce(%g, %fzero), dimensions={{{','.join(map(str, range(len(shard))))}}}, to_apply=%add
  %loss = f32[] all-reduce(%l), channel_id=2, replica_groups={rg}, use_global_device_ids=true, to_apply=%add
  ROOT %out = {root_shape} tuple(%new, %loss{root_extra})
}}
"""
