"""One worker of a multi-process run (started by :func:`disco.multiprocess.launch`).

    python -m disco.mp_worker --process-id I --num-processes P --port PORT \
        --devices-per-process D --out result.json --spec '{"model": "mlp", ...}'
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys


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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--process-id", type=int, required=True)
    ap.add_argument("--num-processes", type=int, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--devices-per-process", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--spec", required=True)
    args = ap.parse_args(argv)
    spec = json.loads(args.spec)

    import jax

    jax.config.update("jax_num_cpu_devices", args.devices_per_process)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{args.port}",
                               num_processes=args.num_processes, process_id=args.process_id)
    import trax_models
    from disco import bench
    from disco.plans import baselines
    from disco.ir import extractor
    from disco.ir.graph import HloGraph

    n = len(jax.devices())
    step, example = trax_models.make_train_step(spec["model"], spec["preset"], devices=n,
                                                optimizer=spec.get("optimizer", "adamw"))
    graph = HloGraph.from_hlo_text(extractor.hlo_text(step, *example))
    plans = {}
    for name in spec["plans"]:
        if name.endswith(".json"):
            from disco.plans.plan import FusionPlan

            with open(name, encoding="utf-8") as f:
                plan = FusionPlan.from_json(f.read())
            plans[f"disco:{plan.name or name}"] = plan.validate(graph)
        else:
            plans[name] = baselines.make(name, graph)
    results = bench.run_bench(step, example, plans, rounds=spec["rounds"], steps=spec["steps"])
    out = {
        "process_id": args.process_id, "num_processes": args.num_processes, "global_devices": n,
        "local_devices": len(jax.local_devices()), "fingerprint": graph.fingerprint,
        "results": [r.to_dict(None) for r in results],
    }
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
    jax.distributed.shutdown()
    with open(args.out, "w") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
