"""The per-kernel GNN's price cache (gnn.kernel_costs.KernelCosts.kernel_time): two kernels with the
same opcodes and shapes but another layout are two kernels, and a price never depends on what was
priced before it."""

from __future__ import annotations

import numpy as np

from disco.ir.graph import Node
from disco.sim.costs import Kernel
from gnn import kernel_costs
from gnn import kernel_features as KF


def _copy(layout: str) -> Kernel:
    p = Node(name="p", opcode="parameter", computation="f", shape="f32[512,1024]", dtype="f32",
             out_bytes=2 << 20, out_elements=1 << 19, flops=0.0)
    c = Node(name="c", opcode="copy", computation="f", shape="f32[512,1024]", dtype="f32", out_bytes=2 << 20,
             out_elements=1 << 19, flops=0.0, operands=("p",), layout=layout)
    return Kernel(nodes=(p, c), in_bytes=2 << 20, out_bytes=2 << 20)


def test_same_key_other_layout_is_priced_as_itself_in_any_order():
    plain, transposed = _copy(""), _copy("0,1")
    assert plain.key() == transposed.key()
    assert not np.array_equal(KF.kernel_graph(plain).nodes, KF.kernel_graph(transposed).nodes)
    a = kernel_costs.load_for_device("h100")

    def fresh() -> kernel_costs.KernelCosts:  # the same model with an empty cache
        return kernel_costs.KernelCosts(a.model, device="h100", corrections=a.corrections)

    first = (a.kernel_time(plain), a.kernel_time(transposed))
    b = fresh()
    second = (b.kernel_time(plain), b.kernel_time(transposed))
    c = fresh()
    reversed_order = (c.kernel_time(transposed), c.kernel_time(plain))[::-1]
    assert first == second == reversed_order
    assert first[0] != first[1]
