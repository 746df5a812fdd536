"""Measures which HLO opcodes XLA:CPU accepts inside an injected (planned) kLoop fusion.

XLA:CPU (jaxlib 0.10.2) *aborts the process* (a CHECK failure, not an exception) on
some injected fusions, e.g. a reshape inside one ("Check failed:
output_shape.has_layout()"). So every trial runs in a child process of this script;
an abort is recorded with the signal and the first ``Check failed`` line of stderr.

For each candidate opcode a tiny function ``sin(OP(expm1(x), ...))`` is lowered in two
settings -- a data-parallel ``jax.shard_map`` step over 4 virtual CPU devices (with a
psum beside it, like a training step) and a plain ``jax.jit`` function -- and the group
{expm1 -> OP -> sin} (single output: the sine) is injected as one kLoop fusion with
disco's rewriter, bypassing ``FUSIBLE_OPCODES`` (that is what is being measured). It is
compiled with ``xla_fusion`` "off" and "extend", run, and compared with the default
jitted compile (``np.allclose``, rtol 1e-6, atol 1e-7).

Results per configuration:
  ok                 compiled, ran, matched the reference
  ok (not fused)     the same, but the compiled module no longer has the opcode inside a
                     fusion (XLA simplified it away), so it says little about the opcode
  wrong-result: ...  ran but differed (max abs error shown)
  error: ...         compile or run raised a Python exception (catchable: falls back)
  abort: ...         the child process died on a signal (uncatchable)
  timeout            the trial ran over --timeout seconds
  n/a: ...           the planned group could not be built for this case

Usage (from the repository root)::

  PYTHONPATH=. .venv/bin/python scripts/tools/measure_fusible.py \
      --json fusible.json --markdown docs/fusible_opcodes.md
  PYTHONPATH=. .venv/bin/python scripts/tools/measure_fusible.py --only add,reshape-split

The internal child mode is ``--child CASE:CONFIG ...``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from scripts.tools.fusible_cases import COLS, CONSUMER, PRODUCER, ROWS, Case  # noqa: E402
from scripts.tools.fusible_cases import cases as all_cases  # noqa: E402

N_DEVICES = 4
CONFIGS = ("shard_map:off", "shard_map:extend", "jit:off", "jit:extend")
RTOL, ATOL = 1e-6, 1e-7
DEFAULT_TIMEOUT = 120.0
REGENERATE = ("PYTHONPATH=. .venv/bin/python scripts/tools/measure_fusible.py "
              "--json fusible.json --markdown docs/fusible_opcodes.md")


# ---------------------------------------------------------------------------------------------
# child side
# ---------------------------------------------------------------------------------------------

def _step(case: Case, mode: str) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    def local(x: Any, y: Any, i: Any) -> Any:
        return lax.sin(case.body(lax.expm1(x), y, i))

    rng = np.random.default_rng(0)
    rows = ROWS * (N_DEVICES if mode == "shard_map" else 1)
    x = rng.uniform(0.1, 1.0, (rows, COLS)).astype(np.float32)
    y = rng.uniform(0.5, 1.5, (rows, COLS)).astype(np.float32)
    i = np.int32(2)
    if mode == "jit":
        return jax.jit(local), (x, y, i)

    def dp_step(x: Any, y: Any, i: Any) -> Any:
        return local(x, y, i), lax.psum(jnp.sum(x), "dp")

    mesh = jax.make_mesh((N_DEVICES,), ("dp",))
    specs = (P("dp"), P("dp"), P())
    f = jax.shard_map(dp_step, mesh=mesh, in_specs=specs, out_specs=(P("dp"), P()), check_vma=False)
    placed = tuple(jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip((x, y, i), specs))
    return jax.jit(f), placed


def _substitute(text: str, old: str, new: str) -> str:
    """Rewrites the opcode of the single instruction ``old`` in the step text to ``new``."""
    import re

    pat = re.compile(r"^(\s*(?:ROOT\s+)?%?[^\s=]+\s*=\s*\S+\s+)" + re.escape(old) + r"\(", re.M)
    hits = pat.findall(text)
    if len(hits) != 1:
        raise LookupError(f"expected one {old} instruction to rewrite, found {len(hits)}")
    return pat.sub(lambda m: m.group(1) + new + "(", text)


def _group(graph: Any, case: Case) -> list[str]:
    """The planned group: everything on producer->consumer paths, plus pulled-in opcodes."""
    from disco.plans import check as plan_check
    from disco.plans.plan import make_plan

    nodes, index = graph.nodes, graph.index()
    succ, pred = collections.defaultdict(set), collections.defaultdict(set)
    for s, d in graph.edges:
        succ[s].add(d)
        pred[d].add(s)

    def only(opcode: str) -> int:
        hits = [k for k, n in enumerate(nodes) if n.opcode == opcode]
        if len(hits) != 1:
            raise LookupError(f"expected one {opcode} marker, found {len(hits)}")
        return hits[0]

    def closure(start: int, nxt: dict[int, set[int]]) -> set[int]:
        seen, todo = {start}, [start]
        while todo:
            for k in nxt[todo.pop()]:
                if k not in seen:
                    seen.add(k)
                    todo.append(k)
        return seen

    p, c = only(PRODUCER), only(CONSUMER)
    ancestors = closure(c, pred)
    group = closure(p, succ) & ancestors
    changed = True
    while changed:  # pull operand-side nodes whose users are all in the group
        changed = False
        for k in sorted(ancestors - group, reverse=True):
            if nodes[k].opcode in case.pull and succ[k] and succ[k] <= group:
                group.add(k)
                changed = True
    if case.drop:
        group.discard(p if case.drop == "producer" else c)
    names = [nodes[k].name for k in sorted(group)]
    if not any(nodes[k].opcode == case.opcode for k in group):
        found = sorted({nodes[k].opcode for k in group})
        raise LookupError(f"no {case.opcode} in the group (it has {', '.join(found)})")
    plan = make_plan([names])
    outs = plan_check._group_outputs(graph, index, names)
    if len(outs) != 1:
        raise LookupError(f"group has {len(outs)} outputs: {outs}")
    if len({nodes[k].computation for k in group}) != 1:
        raise LookupError("group spans computations")
    cycle = plan_check.contraction_cycle(plan, graph)
    if cycle:
        raise LookupError(f"group forms a cycle along {cycle}")
    return names


def _fused_opcodes(compiled_text: str) -> set[str]:
    """Opcodes found inside fused computations of an optimised module."""
    from disco.ir.hlo_parse import parse_module

    module = parse_module(compiled_text)
    fused = set()
    for comp in module.computations:
        for ins in comp.instructions:
            if ins.opcode == "fusion":
                fused.update(ins.called)
    out: set[str] = set()
    todo = list(fused)
    while todo:
        comp = module.computation(todo.pop())
        for ins in comp.instructions:
            out.add(ins.opcode)
            for sub in ins.called:  # e.g. a fused reduce's to_apply
                if sub not in fused:
                    fused.add(sub)
                    todo.append(sub)
    return out


def _trial(case: Case, mode: str, fusion: str) -> dict[str, Any]:
    import jax
    import numpy as np

    from disco.ir.graph import HloGraph
    from disco.plans.plan import make_plan
    from xla_hooks import _jax_private
    from xla_hooks.rewrite import apply_plan_to_text

    fn, args = _step(case, mode)
    lowered = fn.lower(*args)
    text = lowered.as_text(dialect="hlo")
    if case.subst:
        text = _substitute(text, *case.subst)
        ref_exe = _jax_private.compile_rewritten(lowered, text)
        ref = ref_exe(*args)
    else:
        ref = fn(*args)
    try:
        names = _group(HloGraph.from_hlo_text(text), case)
    except LookupError as e:
        return {"result": "n/a", "detail": str(e)}
    plan = make_plan([names], xla_fusion=fusion, name=f"measure:{case.name}")
    new_text = apply_plan_to_text(text, plan)
    try:
        exe = _jax_private.compile_rewritten(lowered, new_text, plan.compiler_options())
        out = exe(*args)
        jax.block_until_ready(out)
    except Exception as e:  # noqa: BLE001 - recorded as the trial's result
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return {"result": "error", "detail": f"{type(e).__name__}: {msg}"[:300], "group": names}
    max_err = 0.0
    ok = True
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(ref)):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            return {"result": "wrong-result", "detail": f"shape {a.shape} != {b.shape}", "group": names}
        ok &= bool(np.allclose(a, b, rtol=RTOL, atol=ATOL, equal_nan=True))
        diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
        max_err = max(max_err, float(np.nanmax(diff)) if diff.size else 0.0)
    fused_ops = _fused_opcodes(exe.as_text())
    res: dict[str, Any] = {"result": "ok" if ok else "wrong-result", "max_abs_err": max_err,
                           "group": names, "in_fusion": case.opcode in fused_ops}
    if not ok:
        res["detail"] = f"max abs err {max_err:.3g}"
    return res


def child_main(tasks: Sequence[str]) -> int:
    cases = {c.name: c for c in all_cases()}
    for task in tasks:
        name, mode, fusion = task.split(":")
        print(f"@@START {task}", flush=True)
        print(f"@@START {task}", file=sys.stderr, flush=True)
        try:
            res = _trial(cases[name], mode, fusion)
        except Exception as e:  # noqa: BLE001 - a failure outside the planned compile
            res = {"result": "error", "detail": f"setup {type(e).__name__}: {str(e)[:200]}"}
        print("@@RESULT " + json.dumps({"task": task, **res}), flush=True)
    return 0


# ---------------------------------------------------------------------------------------------
# parent side
# ---------------------------------------------------------------------------------------------

def _abort_line(stderr_tail: str) -> str:
    lines = [ln.strip() for ln in stderr_tail.splitlines() if ln.strip()]
    for ln in lines:
        if "Check failed" in ln or "CHECK failed" in ln:
            return ln[ln.find("Check failed") if "Check failed" in ln else 0:][:300]
    fatal = [ln for ln in lines if ln[:1] == "F" and ln[1:5].isdigit()]
    if fatal:
        return fatal[0][:300]
    return lines[-1][:300] if lines else ""


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    flags = env.get("XLA_FLAGS", "")
    flags = " ".join(f for f in flags.split() if "xla_force_host_platform_device_count" not in f)
    env["XLA_FLAGS"] = (flags + f" --xla_force_host_platform_device_count={N_DEVICES}").strip()
    env["JAX_PLATFORMS"] = "cpu"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def run_tasks(tasks: Sequence[str], timeout: float = DEFAULT_TIMEOUT,
              python: str = sys.executable) -> dict[str, dict[str, Any]]:
    """Runs trials ("case:mode:fusion") in child processes; an abort or timeout ends only
    the trial that was running, and the rest continue in a fresh child."""
    results: dict[str, dict[str, Any]] = {}
    todo = list(tasks)
    while todo:
        with tempfile.TemporaryFile(mode="w+") as err, subprocess.Popen(
                [python, os.path.abspath(__file__), "--child", *todo], stdout=subprocess.PIPE,
                stderr=err, text=True, env=_child_env()) as proc:
            current: list[str | None] = [None]
            deadline = [time.monotonic() + timeout + 60]  # + start-up (importing jax)
            timed_out = threading.Event()

            def watchdog() -> None:
                while proc.poll() is None:
                    if time.monotonic() > deadline[0]:
                        timed_out.set()
                        proc.kill()
                        return
                    time.sleep(0.5)

            threading.Thread(target=watchdog, daemon=True).start()
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.startswith("@@START "):
                    current[0] = line.split()[1]
                    deadline[0] = time.monotonic() + timeout
                elif line.startswith("@@RESULT "):
                    res = json.loads(line[len("@@RESULT "):])
                    results[res.pop("task")] = res
                    current[0] = None
            rc = proc.wait()
            err.seek(0)
            stderr = err.read()
        todo = [t for t in todo if t not in results]
        if not todo:
            break
        running = current[0] or todo[0]
        tail = stderr.rsplit(f"@@START {running}", 1)[-1]
        if timed_out.is_set():
            results[running] = {"result": "timeout", "detail": f"over {timeout:.0f} s"}
        elif rc < 0:
            sig = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else str(-rc)
            results[running] = {"result": "abort", "signal": -rc,
                                "detail": f"{_abort_line(tail)} ({sig})"}
        else:
            results[running] = {"result": "error", "detail": f"child exited {rc}: {_abort_line(tail)}"}
        todo = [t for t in todo if t != running]
    return results


def measure(names: Sequence[str] | None = None, jobs: int = 1, timeout: float = DEFAULT_TIMEOUT,
            configs: Sequence[str] = CONFIGS, progress: bool = False) -> list[dict[str, Any]]:
    """Measures cases (all by default); returns one row per case."""
    cases = all_cases()
    if names:
        known = {c.name for c in cases}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise SystemExit(f"unknown cases {unknown}; known: {', '.join(sorted(known))}")
        cases = [c for c in cases if c.name in names]
    tasks = [f"{c.name}:{cfg}" for c in cases for cfg in configs]
    chunks = [tasks[k::jobs] for k in range(jobs)] if jobs > 1 else [tasks]
    results: dict[str, dict[str, Any]] = {}
    if jobs > 1:
        from concurrent.futures import ThreadPoolExecutor

        # Interleave by case so each child gets whole cases.
        by_case = [[f"{c.name}:{cfg}" for cfg in configs] for c in cases]
        chunks = [sum(by_case[k::jobs], []) for k in range(jobs)]
        with ThreadPoolExecutor(jobs) as pool:
            for part in pool.map(lambda ch: run_tasks(ch, timeout), chunks):
                results.update(part)
    else:
        results = run_tasks(tasks, timeout)
    rows = []
    for c in cases:
        row = {"case": c.name, "opcode": c.opcode, "note": c.note}
        for cfg in configs:
            row[cfg] = results.get(f"{c.name}:{cfg}", {"result": "error", "detail": "no result"})
        rows.append(row)
        if progress:
            print(f"{c.name:24s} " + "  ".join(cell_text(row[cfg]) for cfg in configs), file=sys.stderr)
    return rows


def cell_text(res: dict[str, Any]) -> str:
    r = res["result"]
    if r == "ok":
        return "ok" if res.get("in_fusion", True) else "ok (not fused)"
    if r in ("timeout",):
        return r
    return f"{r}: {res.get('detail', '')}"


def safe_opcodes(rows: Sequence[dict[str, Any]], configs: Sequence[str] = CONFIGS) -> list[str]:
    """Opcodes ok in every configuration: each of their cases ok (and fused) or n/a there,
    and at least one case ok in each configuration."""
    verdict: dict[str, bool] = {}
    seen_ok: dict[str, set[str]] = collections.defaultdict(set)
    for row in rows:
        if row["case"] == "markers":
            verdict.setdefault(PRODUCER, True)
            verdict.setdefault(CONSUMER, True)
            for op in (PRODUCER, CONSUMER):
                verdict[op] &= all(row[c]["result"] == "ok" for c in configs)
            continue
        cells = [row[c] for c in configs]
        good = all(r["result"] in ("ok", "n/a") and r.get("in_fusion", True) for r in cells)
        verdict[row["opcode"]] = verdict.get(row["opcode"], True) and good
        for c in configs:
            if row[c]["result"] == "ok":
                seen_ok[row["opcode"]].add(c)
    if not verdict.get(PRODUCER, True) or not verdict.get(CONSUMER, True):
        return []  # every case relies on the markers
    return sorted(op for op, good in verdict.items()
                  if good and (op in (PRODUCER, CONSUMER) or seen_ok[op] == set(configs)))


def to_markdown(rows: Sequence[dict[str, Any]], configs: Sequence[str] = CONFIGS,
                header: str = "") -> str:
    esc = lambda s: s.replace("|", "\\|").replace("\n", " ")  # noqa: E731
    out = [header] if header else []
    out.append("| case | opcode | " + " | ".join(configs) + " | note |")
    out.append("|---|---|" + "---|" * len(configs) + "---|")
    for row in rows:
        cells = [esc(cell_text(row[c])) for c in configs]
        out.append(f"| {row['case']} | `{row['opcode']}` | " + " | ".join(cells) + f" | {esc(row['note'])} |")
    safe = safe_opcodes(rows, configs)
    out.append("")
    out.append(f"Opcodes ok in all {len(configs)} configurations ({len(safe)}): "
               + ", ".join(f"`{s}`" for s in safe))
    failing: dict[str, list[str]] = collections.defaultdict(list)
    for row in rows:
        bad = {cell_text(row[c]) for c in configs
               if row[c]["result"] not in ("ok", "n/a") or not row[c].get("in_fusion", True)}
        for text in sorted(bad):
            failing[row["opcode"]].append(f"{row['case']}: {esc(text)}")
    if failing:
        out += ["", "Opcodes not in that list, and why (each distinct failure once per case):", ""]
        for op in sorted(failing):
            out.append(f"- `{op}`: " + "; ".join(failing[op]))
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="comma-separated case names (default: all)")
    ap.add_argument("--jobs", type=int, default=1, help="child processes at once (default 1)")
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per trial")
    ap.add_argument("--json", metavar="PATH", help="write the rows as JSON ('-' for stdout)")
    ap.add_argument("--markdown", metavar="PATH", help="write the markdown table to PATH")
    ap.add_argument("--date", default=time.strftime("%Y-%m-%d"), help="date for the markdown header")
    ap.add_argument("--machine", default="", help="machine description for the markdown header")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument("--child", nargs="+", metavar="CASE:MODE:FUSION", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child_main(args.child)
    if args.list:
        for c in all_cases():
            print(f"{c.name:24s} {c.opcode:22s} {c.note}")
        return 0
    names = [n for n in args.only.split(",") if n] if args.only else None
    t0 = time.monotonic()
    rows = measure(names, jobs=args.jobs, timeout=args.timeout, progress=True)
    elapsed = time.monotonic() - t0
    if args.json:
        payload = json.dumps({"configs": list(CONFIGS), "rows": rows,
                              "safe_opcodes": safe_opcodes(rows)}, indent=1)
        if args.json == "-":
            print(payload)
        else:
            with open(args.json, "w") as f:
                f.write(payload + "\n")
    header = _doc_header(args.date, args.machine, elapsed)
    md = to_markdown(rows, header=header)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(md)
    if args.json != "-":
        print(md)
    return 0


def _doc_header(date: str, machine: str, elapsed: float) -> str:
    import importlib.metadata as md

    try:
        jax_version = md.version("jax")
    except md.PackageNotFoundError:  # pragma: no cover
        jax_version = "?"
    machine = machine or f"{os.cpu_count()}-core {os.uname().machine} CPU"
    return f"""# Opcodes inside an injected kLoop fusion (XLA:CPU)

Measured {date} on a {machine}, jax {jax_version}, by `scripts/tools/measure_fusible.py`
({elapsed:.0f} s). Regenerate with:

    {REGENERATE}

Each case lowers `sin(OP(expm1(x), ...))` and injects the group {{expm1 -> OP -> sin}}
(one output) as a kLoop fusion with disco's rewriter, bypassing `FUSIBLE_OPCODES`, then
compiles it with `xla_fusion` "off" and "extend", runs it and compares it with the
default jitted compile (`np.allclose`, rtol {RTOL:g}, atol {ATOL:g}). "shard_map" is a
data-parallel `jax.shard_map` step over {N_DEVICES} virtual CPU devices (with a psum beside
the group); "jit" is a plain jitted function. Every trial runs in a child process, so
an XLA CHECK failure is recorded as `abort` instead of killing the run.
`ok (not fused)`: it ran and matched, but the optimised module has no such opcode inside
any fusion (XLA rewrote it), so it does not show the opcode is safe. `error` means
compilation raised a Python exception (disco's `apply` falls back on those); `abort`
kills the process and cannot be caught.

"""


if __name__ == "__main__":
    sys.exit(main())
