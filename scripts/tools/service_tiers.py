"""The plan service's two tiers on a GPU cluster: one job per zoo model and tier, on a real server.

Starts ``disco serve`` (``service.testing.ServerProcess``, a fresh SQLite file), posts each model's
step (``--preset``, built for the cluster's device count) as HLO text for ``--cluster`` twice, with
``options.tier`` "emulated" and "auto" (the compiled tier where the server has ``.venv-gpu``), and
prints, per model: the emulated tier's pick, the compiled tier's answer, both priced by the compiled
tier against XLA's default, and each job's wall time. Everything is simulated on this machine
(deviceless XLA:GPU, the service's analytic cost model); nothing is measured on a GPU. Compiles are
cached on disk (``DISCO_COMPILE_CACHE``, default ``~/.cache/disco/compiled``): point it at an empty
directory to time cold compiles.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 PYTHONPATH=. \\
        python scripts/tools/service_tiers.py --models mlp,transformer,bert,resnet50 --out tiers.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time


def _job(server, body: dict) -> tuple[dict, float]:
    t0 = time.monotonic()
    status, answer, _ = server.request("POST", "/v1/plans", body, timeout=300)
    if status == 202:
        job = server.wait_job(answer["job_id"], timeout=1200)
        if job["state"] != "done":
            raise RuntimeError(f"the job failed: {job.get('error')}")
        answer = job["result"]
    elif status != 200:
        raise RuntimeError(f"POST /v1/plans answered {status}: {answer}")
    return answer["report"], time.monotonic() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mlp,transformer,bert,resnet50")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--cluster", default="h100-sxm-8")
    ap.add_argument("--budget", type=float, default=10.0, help="the search's budget_s per job")
    ap.add_argument("--out", help="write every report here (JSON)")
    args = ap.parse_args(argv)

    import trax_models
    from disco.ir import extractor
    from disco.sim.cluster import preset
    from service.testing import ServerProcess

    devices = preset(args.cluster).num_devices
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp, ServerProcess(os.path.join(tmp, "tiers.sqlite")) as server:
        for model in args.models.split(","):
            step, step_args = trax_models.make_train_step(model, args.preset, devices=devices)
            text = extractor.hlo_text(step, *step_args)
            reports, walls = {}, {}
            for tier in ("emulated", "auto"):
                body = {"hlo_text": text, "cluster": args.cluster, "options": {"budget_s": args.budget, "tier": tier}}
                reports[tier], walls[tier] = _job(server, body)
            rows[model] = {"reports": reports, "wall_s": walls}
            auto = reports["auto"]
            if auto["tier"] != "compiled":
                print(f"{model}: the compiled tier did not rank: {auto.get('tier_note')}", flush=True)
                continue
            ms = auto["compiled"]["ms"]
            pick, answer = auto["emulated"]["chosen"], auto["chosen"]
            base = ms["xla_default"]
            print(f"{model}: emulated pick {pick} (emulated {auto['emulated']['speedup_vs_xla_default']:.3f}x, "
                  f"compiled {base / ms[pick]:.3f}x over xla_default); compiled answer {answer} "
                  f"({base / ms[answer]:.3f}x; {ms[pick] / ms[answer]:.3f}x the pick); jobs "
                  f"{walls['emulated']:.0f} s emulated, {walls['auto']:.0f} s compiled", flush=True)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
