"""The plans a ``disco optimize`` run measured, as training data for the cost model.

:func:`export` appends the plans one run measured in its interleaved rounds to a dataset directory
as ``disco.samples/1`` lines with the step's graph (:mod:`disco.data.dataset`, the one writer of
that format), which ``gnn.train.load_dataset`` reads: ``disco optimize --samples DIR`` writes
them, and ``disco train-gnn --data DIR --init shipped`` fine-tunes a model on them.

One run is one group of samples (the plans of one run are compared with each other only): preset
``optimize-<preset>-<run id>``, kind ``"optimize"``. Each sample's reference is xla_default in the
sample's own funnel round (its median over the plan's paired speedup there): the rounds drift apart
(measured on CPU, bert at 8 devices: xla_default 25% slower in its third round than in its first), and the
GNN's loader divides the drift out by each sample's reference. Only the rows measured in the funnel's
rounds are written: the run-off's and the confirmation's rounds are other runs. The lines carry each
plan's median, min and max over its rounds, not the per-round times, and the prediction made before
the plan was measured (``predicted_ms``, ``predicted_by``).

Example::

  >>> result = disco.optimizer.optimize(step, *example, cluster=cluster)     # doctest: +SKIP
  >>> export(result, "data/optimize", model="mlp", preset="small", devices=8)  # doctest: +SKIP
  13
"""

from __future__ import annotations

import os
import time
import uuid
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from disco.optimizer import OptimizeResult

KIND = "optimize"


def export(result: OptimizeResult, out: str | os.PathLike[str], *, model: str, preset: str, devices: int,
           run_id: str | None = None) -> int:
    """Appends the plans ``result`` measured in its rounds to the dataset directory ``out``.

    Args:
      result: what :func:`disco.optimizer.optimize` returned (its ``simulator`` holds the step's graph).
      out: a dataset directory (made when missing).
      model, preset, devices: the step that was measured (``preset`` names the group with ``run_id``).
      run_id: this run's name in the group (default: the UTC time and 8 random hex digits).

    Returns:
      How many samples were written (a sample id already in ``out`` is not written again).

    Raises:
      ValueError: ``out`` exists and is not a directory; the result holds no graph (a predicted
        answer: nothing was measured) or no measured ``xla_default`` (the first round's, the
        reference of a row without a paired speedup).
    """
    from disco.data import dataset
    from disco.data.collect import environment

    graph = getattr(result.simulator, "graph", None)
    rows = [r for r in result.rows if r.median_s is not None and r.measured_in is None]
    reference = next((r.median_s for r in rows if r.name == "xla_default"), None)
    if graph is None or reference is None:
        raise ValueError("samples: this result measured no plan in its rounds (a predicted answer?); "
                         "expected the result of a run that measured xla_default and its candidates")
    out, have = dataset.output_dir(out)
    run_id = run_id or f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{uuid.uuid4().hex[:8]}"
    group = f"optimize-{preset}-{run_id}"
    dataset.write_graph(out, graph.fingerprint, graph.to_json())
    created = time.time()
    versions, device = environment()
    written = 0
    for r in rows:
        line = dataset.sample(
            model=model, preset=group, devices=devices, graph_fingerprint=graph.fingerprint, kind=KIND,
            plan=r.plan, measured={"median_ms": 1e3 * r.median_s, "min_ms": 1e3 * r.min_s, "max_ms": 1e3 * r.max_s,
                                   "rounds": result.config.rounds, "steps": result.config.steps},
            reference_ms=1e3 * (r.median_s * r.speedup if r.speedup else reference), created=created,
            plan_name=r.name, applied=r.applied, fallback_reason=r.fallback_reason,
            predicted_ms=1e3 * r.predicted_s, predicted_by=r.predicted_by,
            compiled={"all_reduces": r.all_reduces}, versions=versions, device=device)
        if line["sample_id"] in have:  # a plan measured twice in one run (two names): its first row
            continue
        dataset.append(dataset.samples_path(out), line)
        have.add(line["sample_id"])
        written += 1
    return written
