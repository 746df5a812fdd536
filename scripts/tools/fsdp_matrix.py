"""Issue 60's matrix: the zoo's fsdp-style steps optimized on 8 CPU devices, in one process and on
2 processes x 4 over an emulated link, each answer checked (docs/results.md, "Sharded (FSDP) steps on
CPU").

Per cell (model x mesh x where), ``disco optimize --style fsdp --mesh DxF --json --out PLAN`` picks
and confirms a plan; then a fresh process checks that plan: the graph's collectives by role, the plan
applied with ``strict=True`` (no fallback), the compiled module's all-gathers and all-reduces (its entry
computation's: a loop body's are XLA's) against what the plan asks, and the parameters after 3 steps against XLA's default's (f32; per leaf, max
``|a - b| <= 1e-5 * max |b| + 1e-7``). Where the answer came from 2 processes, it is also run on
2 processes x 4 (loopback) with every worker's shards compared to XLA's default's. SGD throughout:
Adam turns the rounding noise of parameters whose true gradient is zero (attention key biases) into
steps of the learning rate's size, in XLA's default as in any plan.

Cells already in DIR are kept (a stopped run resumes); ``--table`` prints the markdown table of DIR.

Usage::

  PYTHONPATH=. python scripts/tools/fsdp_matrix.py --dir runs/fsdp \
      --models bert,gpt2,moe,transformer,transformer_lm,vit,resnet50 --meshes 1x8,2x4 --where process,processes
  PYTHONPATH=. python scripts/tools/fsdp_matrix.py --dir runs/fsdp --table
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

WHERE = ("process", "processes")
LINK = "rate=10gbit,delay=50us"
# One cell's search and measurement: short, as the table's cells are many; the confirmation's
# paired rounds are what the "never slower" column reads.
OPTIMIZE = ("--preset", "tiny", "--devices", "8", "--style", "fsdp", "--optimizer", "sgd", "--cluster", "local",
            "--budget", "10", "--measure-rounds", "1", "--measure-top-k", "2", "--finalists", "2",
            "--bucket-sweep", "", "--no-bound", "--rounds", "3", "--confirm-rounds", "6", "--no-progress", "--json")
PROCESSES = ("--processes", "2", "--devices-per-process", "4", "--link", LINK)


def cell_name(model: str, mesh: str, where: str) -> str:
    return f"{model}-{mesh}-{where}"


def _mesh(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)x(\d+)", text)
    if not m:
        raise SystemExit(f"--meshes: expected DATAxFSDP items such as 1x8,2x4, got {text!r}")
    return int(m[1]), int(m[2])


def check_cell(out: Path, model: str, mesh: str, where: str, timeout_s: float) -> dict:
    """:func:`check` of the cell's plan, in a fresh process (8 CPU devices of its own)."""
    cmd = [sys.executable, __file__, "--check", str(out / f"{cell_name(model, mesh, where)}.plan.json"),
           "--model", model, "--mesh", mesh, *(["--processes-check"] if where == "processes" else [])]
    c = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    return json.loads(c.stdout) if c.returncode == 0 else {"error": c.stderr[-2000:]}


def run_cell(out: Path, model: str, mesh: str, where: str, timeout_s: float) -> None:
    """``disco optimize`` for the cell, then :func:`check` in a fresh process; both JSONs in ``out``."""
    name = cell_name(model, mesh, where)
    plan = out / f"{name}.plan.json"
    cmd = [sys.executable, "-m", "disco", "optimize", "--model", model, "--mesh", mesh, *OPTIMIZE,
           "--out", str(plan), *(PROCESSES if where == "processes" else ())]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    (out / f"{name}.stderr").write_text(r.stderr)
    if r.returncode != 0:
        (out / f"{name}.json").write_text(json.dumps({"error": r.stderr[-2000:], "command": cmd}))
        return
    result = json.loads(r.stdout)
    result["matrix"] = {"command": " ".join(cmd[1:]), "wall_s": round(time.time() - t0, 1)}
    result["check"] = check_cell(out, model, mesh, where, timeout_s)
    (out / f"{name}.json").write_text(json.dumps(result, indent=1))


def _expected(graph, plan) -> dict[str, int | None]:
    """The compiled module's collectives the plan asks for: a gather bucket is one all-gather; an
    all-reduce bucket one all-reduce ("rs_ag": a reduce-scatter and an all-gather); collectives in
    no bucket stay one each. None where the plan leaves them to XLA (its combiner decides)."""
    gathers = sum(n.opcode == "all-gather" for n in graph.nodes)
    reduces = sum(n.is_all_reduce for n in graph.nodes)
    rs_ag = 0 if plan.buckets is None else sum(b.build == "rs_ag" for b in plan.buckets)
    want_gathers = None
    if plan.gather_buckets is not None:
        want_gathers = gathers - sum(map(len, plan.gather_buckets)) + len(plan.gather_buckets) + rs_ag
    want_reduces = None
    if plan.buckets is not None:
        want_reduces = reduces - sum(len(b.members) for b in plan.buckets) + len(plan.buckets) - rs_ag
    return {"all_gathers": want_gathers, "all_reduces": want_reduces}


def _compiled(text: str) -> dict[str, int]:
    """The compiled module's collectives: in its entry computation (what the graph and the plan read)
    and, as ``loop_*``, in the other computations (a scanned model's loop bodies, which no plan
    buckets)."""
    from disco.ir.hlo_parse import parse_module

    names = {"all-gather": "all_gathers", "all-reduce": "all_reduces", "reduce-scatter": "reduce_scatters"}
    counts = {f"{where}{v}": 0 for where in ("", "loop_") for v in names.values()}
    for comp in parse_module(text).computations:
        for ins in comp.instructions:
            key = names.get(ins.opcode.removesuffix("-start"))
            if key:
                counts[key if comp.is_entry else f"loop_{key}"] += 1
    return counts


def _max_rel_error(a, b) -> float:
    """Over the leaves, max |a - b| / (max |b| + 1e-2): at most 1e-5 exactly where every leaf
    keeps ``|a - b| <= 1e-5 * max |b| + 1e-7`` (:func:`_numbers_equal`)."""
    import jax
    import numpy as np

    worst = 0.0
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        x64, y64 = np.asarray(x, np.float64), np.asarray(y, np.float64)
        err = float(np.max(np.abs(x64 - y64), initial=0.0))
        worst = max(worst, err / (float(np.max(np.abs(y64), initial=0.0)) + 1e-2))
    return worst


def check(plan_path: str, model: str, mesh: str, processes: bool) -> dict:
    """The plan of ``plan_path`` applied to the cell's step in this process on 8 CPU devices (and, with
    ``processes``, on 2 processes x 4): what the module-level docstring lists."""
    import jax

    jax.config.update("jax_num_cpu_devices", 8)
    import warnings

    import disco
    import trax_models
    import xla_hooks
    from disco.plans.plan import FusionPlan

    step, args = trax_models.make_train_step(model, "tiny", devices=8, style="fsdp", mesh_shape=_mesh(mesh),
                                             optimizer="sgd")
    graph = disco.extract(step, *args)
    roles: dict[str, int] = {}
    for c in graph.collective_roles():
        roles[c.role] = roles.get(c.role, 0) + 1
    plan = FusionPlan.from_json(Path(plan_path).read_text())
    out: dict = {"roles": roles, "plan": plan.name, "plan_fingerprint_matches": plan.graph_fingerprint in
                 (None, graph.fingerprint)}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        applied = xla_hooks.apply(plan, step, *args, strict=True)
    out["applied"] = bool(applied.applied)
    out["fallback_reason"] = applied.fallback_reason
    out["warnings"] = [str(w.message)[:300] for w in caught]
    out["expected"] = _expected(graph, plan.validate(graph))
    out["compiled"] = _compiled(applied.compiled_text())
    out["default_compiled"] = _compiled(jax.jit(step).lower(*args).compile().as_text())

    def three(fn):
        state, batch = args
        for _ in range(3):
            state, _ = fn(state, batch)
        return jax.tree.map(lambda x: jax.device_get(x), state)

    reference, got = three(jax.jit(step)), three(applied)
    out["max_rel_error"] = _max_rel_error(got, reference)
    out["numbers_equal"] = _numbers_equal(got, reference)
    if processes:
        out["processes"] = _processes_check(plan_path, model, mesh)
    return out


def _numbers_equal(a, b, rtol: float = 1e-5, floor: float = 1e-7) -> bool:
    import jax

    return all(_leaf_close(x, y, rtol, floor) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


def _leaf_close(x, y, rtol: float = 1e-5, floor: float = 1e-7) -> bool:
    """``max |x - y| <= rtol * max |y| + floor`` (in float64)."""
    import numpy as np

    x64, y64 = np.asarray(x, np.float64), np.asarray(y, np.float64)
    return float(np.max(np.abs(x64 - y64), initial=0.0)) <= rtol * float(np.max(np.abs(y64), initial=0.0)) + floor


def _processes_check(plan_path: str, model: str, mesh: str) -> dict:
    """2 processes x 4 (loopback) run XLA's default and the plan for 3 steps each: every worker
    applied the same plan, and its shards equal XLA's default's."""

    from disco.runtime import multiprocess

    spec = multiprocess.WorkerSpec(model=model, preset="tiny", plans=("xla_default", plan_path), rounds=1, steps=1,
                                   optimizer="sgd", style="fsdp", mesh_shape=_mesh(mesh), check_steps=3)
    res = multiprocess.launch(2, 4, spec, timeout_s=900)
    if not res.ok:
        return {"ok": False, "failures": list(res.failures)}
    digests = {(x["plan"], x["plan_digest"]) for r in res.results for x in r["results"]}
    applied = all(x["applied"] for r in res.results for x in r["results"])
    equal = True
    for proc in res.results:
        ref = proc["checks"]["xla_default"]["leaves"]
        row = next(k for k in proc["checks"] if k != "xla_default")
        equal &= all(_leaf_close(x, y) for x, y in zip(proc["checks"][row]["leaves"], ref, strict=True))
    return {"ok": True, "same_plans": len(digests) == 2, "applied": applied, "numbers_equal": bool(equal)}


def _mib(n) -> str:
    return "-" if n is None else f"{n / 2**20:.2f}"


def table(out: Path) -> str:
    """The markdown table of every cell in ``out``."""
    lines = ["| model | mesh | where | answer | confirmed vs XLA default (90%) | peak MiB: answer / default | "
             "gathers, scatters, reduces in the graph | applied | compiled all-gathers, all-reduces: asked / got | "
             "3 steps equal | slower than default? |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for path in sorted(out.glob("*.json")):
        if path.name.endswith(".plan.json"):
            continue
        model, mesh, where = path.stem.rsplit("-", 2)
        r = json.loads(path.read_text())
        if "error" in r:
            lines.append(f"| {model} | {mesh} | {where} | failed: {r['error'].strip().splitlines()[-1][:120]} |"
                         + " |" * 7)
            continue
        rows = {x["name"]: x for x in r["rows"]}
        chosen, base = rows[r["chosen"]], rows["xla_default"]
        c = r["check"]
        if "error" in c:
            checked = f"check failed: {c['error'].strip().splitlines()[-1][:100]}"
            lines.append(f"| {model} | {mesh} | {where} | `{r['chosen']}` | - | - | {checked} |" + " |" * 4)
            continue
        lo, hi = r.get("confirmed_speedup_interval") or (None, None)
        gain = r.get("confirmed_speedup")
        gain_text = "-" if gain is None else f"{gain:.3f}x ({lo:.3f}-{hi:.3f})" if lo else f"{gain:.3f}x"
        roles = c["roles"]
        exp, got = c["expected"], c["compiled"]
        compiled = (f"{_n(exp['all_gathers'])}, {_n(exp['all_reduces'])} / {got['all_gathers']}, "
                    f"{got['all_reduces']}")
        if got.get("loop_all_gathers") or got.get("loop_all_reduces"):
            d = c["default_compiled"]
            compiled += (f" (in loops: {got['loop_all_gathers']}, {got['loop_all_reduces']}; XLA default "
                         f"{d['loop_all_gathers']}, {d['loop_all_reduces']})")
        equal = "yes" if c["numbers_equal"] else f"no ({c['max_rel_error']:.2g})"
        applied = "yes" if c["applied"] and not c["fallback_reason"] else f"no: {c['fallback_reason']}"
        if "processes" in c:
            p = c["processes"]
            ok = p.get("ok") and p["same_plans"] and p["applied"] and p["numbers_equal"]
            equal += "; 2 processes: " + ("yes" if ok else f"no {p}")
        slower = "-" if hi is None else ("yes" if hi < 1.0 else "no")
        lines.append(f"| {model} | {mesh} | {where} | `{r['chosen']}` | {gain_text} | "
                     f"{_mib(chosen.get('peak_memory_bytes'))} / {_mib(base.get('peak_memory_bytes'))} | "
                     f"{roles.get('param_gather', 0)}, {roles.get('grad_scatter', 0)}, {roles.get('grad_reduce', 0)} | "
                     f"{applied} | {compiled} | {equal} | {slower} |")
    return "\n".join(lines)


def _n(v) -> str:
    return "XLA" if v is None else str(v)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="runs/fsdp", help="where each cell's JSON is kept")
    ap.add_argument("--models", default="bert,gpt2,moe,transformer,transformer_lm,vit,resnet50")
    ap.add_argument("--meshes", default="1x8,2x4")
    ap.add_argument("--where", default="process,processes", help="process (8 devices in one) and/or processes "
                    f"(2 x 4 over an emulated {LINK} link)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per cell's optimize and check")
    ap.add_argument("--table", action="store_true", help="print the table of --dir; run nothing")
    ap.add_argument("--recheck", action="store_true", help="check the plans of the cells in --dir again "
                    "(nothing optimized), then print the table")
    ap.add_argument("--check", metavar="PLAN", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--mesh", help=argparse.SUPPRESS)
    ap.add_argument("--processes-check", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.check:
        print(json.dumps(check(a.check, a.model, a.mesh, a.processes_check)))
        return 0
    out = Path(a.dir)
    if a.table:
        print(table(out))
        return 0
    if a.recheck:
        for path in sorted(out.glob("*.plan.json")):
            model, mesh, where = path.name.removesuffix(".plan.json").rsplit("-", 2)
            result = json.loads((out / f"{cell_name(model, mesh, where)}.json").read_text())
            result["check"] = check_cell(out, model, mesh, where, a.timeout)
            (out / f"{cell_name(model, mesh, where)}.json").write_text(json.dumps(result, indent=1))
        print(table(out))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    wheres = a.where.split(",")
    if bad := [w for w in wheres if w not in WHERE]:
        raise SystemExit(f"--where: expected items of {', '.join(WHERE)}, got {','.join(bad)}")
    meshes = [m for m in a.meshes.split(",") if _mesh(m)]
    for where in wheres:
        for model in a.models.split(","):
            for mesh in meshes:
                if (out / f"{cell_name(model, mesh, where)}.json").exists():
                    continue
                print(f"{time.strftime('%H:%M:%S')} {cell_name(model, mesh, where)}", file=sys.stderr, flush=True)
                run_cell(out, model, mesh, where, a.timeout)
    print(table(out))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONPATH", str(Path(__file__).resolve().parents[2]))
    sys.exit(main())
