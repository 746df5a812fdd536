"""The step times jobs measured (``POST /v1/trials``) as training data for the cost model.

:func:`export` writes every measured run of a service database as ``disco.samples/1`` lines
with their graphs (:mod:`disco.data.dataset`, the one writer of that format), which
``gnn.train.load_dataset`` reads: ``disco train-gnn --trials DB --data DIR`` exports into
``DIR`` and trains on it. One run is one group of samples (the times of one job are compared
with each other only): model the graph's name, preset ``trials-<run id>``, devices the job's;
the run's ``xla_default`` time, where it measured one, is every sample's reference.

Example::

  >>> export("plans.sqlite", "data/trials")      # doctest: +SKIP
  12
"""

from __future__ import annotations

import os
import statistics
from typing import Any

from service import inputs
from service.store import Store


def export(database: str | os.PathLike[str], out: str | os.PathLike[str]) -> int:
    """Appends the measured trials of ``database`` to the dataset directory ``out``.

    Args:
      database: the service's SQLite file or ``postgresql://`` URL.
      out: a dataset directory (made when missing); samples already in it (by sample id) are not
        written again.

    Returns:
      How many samples were written.

    Raises:
      ValueError: ``out`` exists and is not a directory.
    """
    from disco.data import dataset
    from disco.plans.plan import FusionPlan

    out, have = dataset.output_dir(out)
    written = 0
    with Store(os.fspath(database)) as store:
        runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for t in store.trials():
            runs.setdefault((t["key"], t["run_id"]), []).append(t)
        graphs: dict[str, Any] = {}
        for (key, run_id), trials in runs.items():
            if key not in graphs:
                request = store.key_request(key)
                graphs[key] = None if request is None else inputs.graph_from_stored(request)
            graph = graphs[key]
            if graph is None:  # the job's inputs are gone: no graph to learn from
                continue
            dataset.write_graph(out, trials[0]["fingerprint"], graph.to_json())
            environment = trials[0]["environment"] or {}
            devices = int(environment.get("processes", 1)) * int(environment.get("devices_per_process", 1))
            reference = next((t["step_time_ms"] for t in trials if t["name"] == "xla_default"), None)
            for t in trials:
                per_step = [max(step) for step in zip(*t["samples_ms"])]
                line = dataset.sample(
                    model=graph.name, preset=f"trials-{run_id}", devices=devices,
                    graph_fingerprint=t["fingerprint"], kind="trial", plan=FusionPlan.from_dict(t["plan"]),
                    measured={"median_ms": t["step_time_ms"], "min_ms": min(per_step), "max_ms": max(per_step),
                              "samples_ms": per_step, "rounds": len(per_step), "steps": 1},
                    reference_ms=reference, created=t["created_at"], plan_name=t["name"], applied=True,
                    predicted_ms=t["predicted_ms"], winner=t["winner"], plan_key=key, versions=environment,
                    device=environment.get("device_kind"))
                if line["sample_id"] in have:
                    continue
                dataset.append(dataset.samples_path(out), line)
                have.add(line["sample_id"])
                written += 1
    return written


def median_ms(samples_ms: list[list[float]]) -> float:
    """The median over steps of each step's time on the slowest process (what a run's trial measured)."""
    return statistics.median(max(step) for step in zip(*samples_ms))
