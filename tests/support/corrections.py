"""Measured points of a synthetic machine, for the correction's tests."""

from __future__ import annotations

import random

from disco.calibrate.correction import Point


def step_points(graph: str, scale: float, seed: int, n: int) -> list[Point]:
    """``n`` plans of the step ``graph`` whose compute the cost model prices ``scale`` x too fast, on
    one machine: the same exposed communication and 0.8 ms per all-reduce for every step, 1-8
    all-reduces a plan."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        c, e, k = 0.008 + rng.random() * 0.002, rng.random() * 0.004, rng.randint(1, 8)
        out.append(Point(graph, f"{graph}{i}", (c, e, e + 0.001, k * 1e-3), scale * c + e + 0.8e-3 * k))
    return out
