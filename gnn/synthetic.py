"""A stand-in profile dataset: random plans priced by the simulator, in the collector's format.

Real training uses measured samples written by the profile collector
(``DIR/samples.jsonl`` + ``DIR/graphs/<fingerprint>.json``). Until those exist, and
for fast tests, :func:`write_dataset` writes the same layout with the step time of
each plan taken from :class:`disco.sim.simulator.Simulator` under a perturbed
:class:`disco.sim.costs.AnalyticCosts` plus multiplicative noise. Numbers trained on
this are *not* measurements and must never be reported as such.

Example:
  >>> from gnn import synthetic
  >>> synthetic.write_dataset("/tmp/synth", graphs, plans_per_graph=40)  # doctest: +SKIP
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping
from pathlib import Path

from disco.data import dataset
from disco.ir.graph import HloGraph


def write_dataset(out: str | os.PathLike[str], graphs: Mapping[str, HloGraph], *, plans_per_graph: int = 40,
                  devices: int = 4, seed: int = 0, noise: float = 0.02) -> Path:
    """Writes ``samples.jsonl`` and ``graphs/`` for ``graphs`` (model name -> graph).

    Args:
      out: the dataset directory (created).
      graphs: model name -> its step graph.
      plans_per_graph: random plans per model (baselines are added on top).
      devices: the device count written into each sample and used for the cluster.
      seed: the random seed (plans and noise).
      noise: relative standard deviation of the multiplicative noise.

    Returns:
      The directory.
    """
    from disco.plans import baselines
    from disco.sim.cluster import preset
    from disco.sim.costs import AnalyticConfig, AnalyticCosts
    from disco.plans.random_plans import random_plan
    from disco.sim.simulator import Simulator

    out = Path(out)
    (out / "graphs").mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    # A "true" machine that differs from the analytic defaults, so the learner has something to learn.
    truth = AnalyticCosts(AnalyticConfig(peak_flops=2e10, mem_bandwidth=4e9, launch_overhead=4e-6))
    cluster = preset("local", devices)
    lines = []
    for mi, (model, graph) in enumerate(sorted(graphs.items())):
        dataset.write_graph(out, graph.fingerprint, graph.to_json())
        sim = Simulator(graph, truth, cluster)
        plans = [baselines.make(name, graph) for name in ("xla_default", "per_tensor", "one_bucket", "ddp")]
        for k in range(plans_per_graph):
            try:
                plans.append(random_plan(graph, seed * 100003 + mi * 1009 + k, n_groups=rng.randint(1, 24)))
            except ValueError:
                continue
        ref = sim.step_time(plans[0])
        for round_, plan in enumerate(plans):
            t = sim.step_time(plan) * (1.0 + rng.gauss(0.0, noise))
            ms = t * 1e3
            lines.append(dataset.encode({
                "sample_id": dataset.sample_id(model, "tiny", devices, plan.digest()), "model": model,
                "preset": "tiny", "devices": devices, "graph_fingerprint": graph.fingerprint,
                "plan": plan.to_dict(), "measured": {"median_ms": ms, "min_ms": ms * 0.97, "max_ms": ms * 1.05},
                "reference_xla_default_median_ms": ref * 1e3 * (1.0 + rng.gauss(0.0, noise / 2)),
                "round": round_, "synthetic": True}))
    Path(dataset.samples_path(out)).write_text("".join(lines))
    return out


def zoo_graphs(models: tuple[str, ...] = ("mlp", "transformer_lm", "bert", "rnnlm"), preset: str = "tiny",
               devices: int = 4) -> dict[str, HloGraph]:
    """Extracts the pre-optimisation graphs of zoo models (needs jax with ``devices`` CPU devices)."""
    import trax_models

    from disco.ir.extractor import extract

    out = {}
    for m in models:
        step, args = trax_models.make_train_step(m, preset, devices=devices)
        out[m] = extract(step, *args)
    return out


if __name__ == "__main__":  # pragma: no cover
    import sys

    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    target = sys.argv[1] if len(sys.argv) > 1 else "/tmp/gnn_synth"
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 60
    write_dataset(target, zoo_graphs(), plans_per_graph=n)
    print(target)
