"""One worker of a multi-process run (started by :func:`disco.runtime.multiprocess.launch`).

    python -m disco.runtime.worker --process-id I --num-processes P --coordinator HOST:PORT \
        --devices-per-process D --out result.json --spec '{"task": "bench", "model": "mlp", ...}'

Tasks (:class:`disco.runtime.multiprocess.WorkerSpec`): ``bench`` measures plans (baseline items such as
``ddp`` or ``horovod:128``, or plan .json files) in interleaved rounds and reports every round's time (with
``comm_free_bound``, also the step with its all-reduces replaced by copies: the compute floor);
``jit`` trains the step under ``xla_hooks.jit`` once per scenario (each process asking the service
its scenario names for it: only process 0's is asked; a scenario may ask for ``trials``, ``trial_steps``
and its own number of ``steps``) and reports what each process compiled and measured,
beside the losses of XLA's default; ``calibrate`` times all-reduces of ``sizes`` bytes per device (with ``chain``: executables of
k chained all-reduces per size) and a variadic all-reduce against one concatenated buffer
(:mod:`disco.runtime.allreduce_timing`) over all processes' devices; ``bench`` with ``chain`` also runs the
chained timings in the same launch, after its rounds.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from typing import Any


def _param_digest(state) -> str:
    import jax
    import numpy as np

    h = hashlib.sha256()
    for leaf in jax.tree.leaves(state):
        h.update(np.asarray(leaf.addressable_data(0)).tobytes())
    return h.hexdigest()[:16]


def _local_leaves(state):
    import jax
    import numpy as np

    return [np.asarray(leaf.addressable_data(0)).tolist() for leaf in jax.tree.leaves(state)]


def _plans(names: list[str], graph: Any) -> dict[str, Any]:
    """The plans by row name. A baseline item's row and plan are
    :func:`disco.plans.baselines.parse_item`'s; a plan file's row is its plan's name, or its path where
    the plan has none or another item's row or ``xla_default`` has it (as
    ``disco.cli.common.resolve_plans``)."""
    from disco.plans import baselines
    from disco.plans.plan import FusionPlan

    plans = {}
    items = {n: baselines.parse_item(n) for n in names if not n.endswith(".json")}
    taken = {"xla_default", *(b.row for b in items.values())}
    for name in names:
        if name.endswith(".json"):
            with open(name, encoding="utf-8") as f:
                plan = FusionPlan.from_json(f.read())
            row = plan.name if plan.name and plan.name not in taken else name
            taken.add(row)
            plans[row] = plan.validate(graph)
        else:
            plans[items[name].row] = items[name].make(graph)
    return plans


def _make_step(spec: dict[str, Any], n: int) -> tuple[Any, Any]:
    """The zoo step the spec names, over the ``n`` devices of all the processes."""
    import trax_models

    mesh = spec.get("mesh_shape")
    return trax_models.make_train_step(spec["model"], spec["preset"], devices=n,
                                       optimizer=spec.get("optimizer", "adamw"),
                                       style=spec.get("style", "shard_map"),
                                       mesh_shape=None if mesh is None else tuple(mesh))


def _bench(spec: dict[str, Any], n: int) -> dict[str, Any]:
    from disco import bench
    from disco.ir import extractor
    from disco.ir.graph import HloGraph

    step, example = _make_step(spec, n)
    graph = HloGraph.from_hlo_text(extractor.hlo_text(step, *example))
    plans = _plans(spec["plans"], graph)
    results = bench.run_bench(step, example, plans, rounds=spec["rounds"], steps=spec["steps"],
                              comm_free_bound=spec.get("comm_free_bound", False))
    rows = []
    for r in results:
        row = r.to_dict(None)
        row["samples_ms"] = [t * 1e3 for t in r.measurement.samples]
        rows.append(row)
    out: dict[str, Any] = {"fingerprint": graph.fingerprint, "gradient_bytes": graph.summary()["gradient_bytes"],
                           "results": rows}
    if spec.get("check_steps"):
        from xla_hooks import apply_plan

        checks = {}
        for name, plan in plans.items():
            fn = apply_plan.apply(plan, step, *example)
            state, batch = example
            for _ in range(spec["check_steps"]):
                state, _ = fn(state, batch)
            checks[name] = {"digest": _param_digest(state), "leaves": _local_leaves(state)}
        out["checks"] = checks
    if spec.get("chain"):  # the chained all-reduces in the same launch, right after the rounds
        out["chain_calibration"] = _chain(spec, n)
    return out


def _chain(spec: dict[str, Any], n: int) -> dict[str, Any]:
    """Executables of k chained all-reduces per size: ``chain_medians_s[size][k]`` (seconds per call)
    and the all-reduces XLA kept in each (``chain_all_reduces``, k expected)."""
    from disco.runtime import allreduce_timing as timing

    return timing.time_chained(n, tuple(spec.get("sizes") or timing.SIZES), tuple(spec["chain"]),
                                  spec.get("reps", 20))


def _jit(spec: dict[str, Any], n: int, process_id: int) -> dict[str, Any]:
    """Per scenario: a fresh ``xla_hooks.jit`` of the step with this process's service URL ("" for
    the local planner), ``check_steps`` steps (at least one), what it compiled and what it warned."""
    import time
    import warnings

    import jax
    import numpy as np

    import xla_hooks
    from disco.bench import compiled_counts

    def loss_value(loss: Any) -> float:
        return float(np.asarray(loss.addressable_data(0)).reshape(-1)[0])  # a pmap step's: one per device

    step, (state0, batch) = _make_step(spec, n)
    steps = max(1, int(spec.get("check_steps") or 0))
    most = max([steps, *(int(sc.get("steps") or 0) for sc in spec["scenarios"])])
    default, state = jax.jit(step), state0
    default_losses = []
    for _ in range(most):
        state, loss = default(state, batch)
        default_losses.append(loss_value(loss))
    rows = []
    for sc in spec["scenarios"]:
        service = sc["services"][process_id] or None
        planned = xla_hooks.jit(step, service=service, cluster="local", timeout_s=sc.get("timeout_s", 30.0),
                                token=sc.get("token"), options=sc.get("options"),
                                agree_timeout_s=sc.get("agree_timeout_s", 60.0), trials=sc.get("trials", 0),
                                trial_steps=sc.get("trial_steps", 3))
        t0 = time.monotonic()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            state, losses = state0, []
            for _ in range(int(sc.get("steps") or steps)):
                state, loss = planned(state, batch)
                losses.append(loss_value(loss))
        (applied,) = planned.applied.values()
        (report,) = planned.reports.values()
        rows.append({"name": sc["name"], "applied": applied.applied, "plan": applied.plan.name,
                     "plan_digest": applied.plan.digest(), "requested": applied.requested.name,
                     "all_reduces": compiled_counts(applied.compiled_text())[1], "losses": losses,
                     "report_environment": (report or {}).get("environment"),
                     "trials": next(iter(planned.trials.values()), None),
                     "measured": (report or {}).get("measured"),
                     "seconds": time.monotonic() - t0,
                     "warnings": [f"{w.category.__name__}: {w.message}" for w in caught]})
    return {"default_losses": default_losses, "scenarios": rows}


def _calibrate(spec: dict[str, Any], n: int) -> dict[str, Any]:
    from disco.runtime import allreduce_timing as timing

    return timing.time_all_reduces(n, tuple(spec.get("sizes") or timing.SIZES), spec.get("reps", 20),
                                      tuple(spec.get("chain") or ()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--process-id", type=int, required=True)
    ap.add_argument("--num-processes", type=int, required=True)
    ap.add_argument("--coordinator", required=True, help="HOST:PORT of process 0's coordinator")
    ap.add_argument("--devices-per-process", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--spec", required=True)
    args = ap.parse_args(argv)
    spec = json.loads(args.spec)

    import jax

    jax.config.update("jax_num_cpu_devices", args.devices_per_process)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # A long heartbeat timeout: on 2 loaded cores (load average 18) both workers of a run aborted in
    # CoordinationServiceAgent::StartSendingHeartbeats at the default 100 s; the launcher notices
    # dead workers itself (disco.runtime.multiprocess.launch's grace_s).
    jax.distributed.initialize(coordinator_address=args.coordinator, num_processes=args.num_processes,
                               process_id=args.process_id, heartbeat_timeout_seconds=600)
    n = len(jax.devices())
    task = spec.get("task", "bench")
    body = (_calibrate(spec, n) if task == "calibrate" else _jit(spec, n, args.process_id) if task == "jit"
            else _bench(spec, n))
    out = {"process_id": args.process_id, "num_processes": args.num_processes, "global_devices": n,
           "local_devices": len(jax.local_devices()), "task": task, **body}
    jax.distributed.shutdown()
    with open(args.out, "w") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
