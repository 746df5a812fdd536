"""``disco optimize``'s output: the measured run's table, the predicted run's, the verdict's lines, the plot.

What :mod:`disco.cli.optimize` prints once a run is done, from the result alone
(:class:`disco.optimizer.OptimizeResult` or the predicted result) and the run's ``info`` (model,
devices, cost model, cluster). rich and matplotlib are imported when a table or a plot is made.
"""

from __future__ import annotations

from typing import Any

from disco.cli.common import CliError, Footnotes, counted, print_note, table_console
from disco.sim.memory import bytes_short


def measured_on(info: dict[str, Any]) -> str:
    """Where a run's figures were measured, for every line that gives one: "CPU", "GPU", or "CPU
    (2 processes over <link>)"."""
    platform = str(info.get("device_kind") or "cpu").split(":")[0].upper()
    if info.get("processes"):
        return f"{platform} ({info['processes']} processes over {info.get('over', 'loopback')})"
    return platform


def _title(info: dict[str, Any]) -> str:
    return f"{info['model']}/{info['preset']} on {info['devices']} devices"


def print_measured(result: Any, info: dict[str, Any], *, details: bool = False) -> None:
    """``disco optimize``'s output for a measured run: with ``details`` the table, the funnel and
    the diagnostics (:func:`print_table`, the accuracy figures one per line), then the answer
    (:func:`disco.optimizer.answer_lines`: at most 15 lines of 100 columns)."""
    from disco.optimizer import answer_lines

    if details:
        print_table(result, info)
        console = table_console()
        for line in result.accuracy.detail_lines():
            print_note(console, line, indent="  ")
        print()
    for line in answer_lines(result, title=_title(info), measured_on=measured_on(info),
                             plan_file=info.get("plan_file"),
                             more="--details: every plan measured and the diagnostics; --json: everything"
                             if not details else "--json: everything"):
        print(line)


def print_predicted(result: Any, info: dict[str, Any], *, details: bool = False) -> None:
    """``disco optimize``'s output for a run chosen by prediction (nothing measured): with
    ``details`` the table of every candidate, then the answer in a few lines."""
    if details:
        print_predicted_table(result, info)
        print()
    import textwrap

    from disco.optimizer import apply_snippet
    from disco.plans.naming import describe

    graph = result.simulator.graph if getattr(result, "simulator", None) is not None else None
    lines: list[str] = []

    def add(text: str, indent: str = "  ") -> None:
        lines.extend(textwrap.wrap(text, width=100, initial_indent=indent, subsequent_indent=indent + "  ",
                                   break_on_hyphens=False, break_long_words=False))

    add(f"disco optimize {_title(info)}: the answer is {result.chosen} (predicted, not measured)", indent="")
    add(f"what it does: {describe(result.plan, graph)}")
    add(f"simulated on cluster {result.cluster!r} ({result.tier} tier): {result.speedup:.3f}x faster than "
        "XLA's default")
    memory = memory_line(result)
    if memory:
        add(memory)
    add("nothing was measured: this machine's devices are not the cluster's; measure it there "
        "(xla_hooks.jit(step, service=..., trials=n))")
    if info.get("plan_file") and result.chosen != "xla_default":
        add("the plan is written to path; to apply it on the cluster, in a training script:")
        lines.extend("    " + line for line in apply_snippet(info["plan_file"]))
    add("--details: every candidate and its prices; --json: everything" if not details else "--json: everything")
    for line in lines:
        print(line)


def print_predicted_table(result: Any, info: dict[str, Any]) -> None:
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=(f"disco optimize {info['model']}/{info['preset']} for cluster {result.cluster!r}"
                     f"{_cluster_note(info)}: predicted with the {_describe_costs(info)} cost model, not measured"))
    for c in ("plan", "from", "emulated ms", "compiled ms", "speedup vs\nxla_default\n(predicted)", "kernels",
              "all-reduces", "peak mem\n(predicted)"):
        t.add_column(c, justify="left" if c in ("plan", "from") else "right")
    notes: dict[str, int] = {}
    base = result.row("xla_default").predicted_s(result.tier)
    for r in result.rows:
        origin = r.origin if r.kind == "search" else "baseline"
        mark = f"[{notes.setdefault(origin, len(notes) + 1)}]" if r.kind == "search" else origin
        mine = r.predicted_s(result.tier)
        t.add_row(escape(r.name + (" *" if r.name == result.chosen else "")), escape(mark), f"{r.emulated_s * 1e3:.3f}",
                  "-" if r.compiled_s is None else f"{r.compiled_s * 1e3:.3f}",
                  f"{base / mine:.3f}x" if base and mine else "-",
                  "-" if r.compiled is None else str(r.compiled.get("kernels")),
                  "-" if r.compiled is None else str(r.compiled.get("collectives")),
                  bytes_short(r.peak_memory_bytes) + _MEMORY_MARKS.get(r.memory_from or "", "")
                  + ("!" if r.over_memory else ""))
    console = table_console()
    console.print(t)
    for origin, i in notes.items():
        print_note(console, f"[{i}] {origin}")
    print_note(console, f"* the answer: {result.chosen}, the fastest by the {result.tier} tier")
    if result.tier_note:
        print_note(console, f"ranked by the emulated tier: {result.tier_note}")
    print_note(console, "emulated: the simulator's step time (Python emulation of XLA's fusion); compiled: the module "
                        "the real compiler builds for the cluster's devices, its kernels and collectives priced on the "
                        "cluster; '-': not compiled (or it failed: --json says why)")
    limit = result.memory_limit
    print_note(console, "peak mem: bytes per device (K = KiB), predicted (simulated, not measured): XLA's memory analysis "
                        "of the module compiled for the cluster (arguments + outputs - donated + temporaries); "
                        "~: estimated from the compiled module's buffers; c: XLA:CPU's analysis of the plan compiled "
                        "here (no compiled tier ran; not the cluster's compiler); "
                        + (f"!: above the limit of {limit:,} bytes, never the answer" if limit else
                           "no memory limit (--memory-limit, or a cluster's device_memory)"))
    s = result.search
    print_note(console, f"simulated lower bound {result.lower_bound_s * 1e3:.3f} ms; search: {s.strategy}, {s.evals} "
                        f"plans in {s.seconds:.1f} s")
    print_note(console, f"the answer is {result.chosen}, predicted {result.speedup:.3f}x faster than xla_default on "
                        f"{result.cluster!r} ({result.tier} tier); nothing was measured", bold="the answer")
    _print_plan_lines(console, result.chosen, result.rows)



# the peak mem column's mark of where a predicted peak came from (PredictedRow.memory_from): none for XLA's own
_MEMORY_MARKS = {"module-estimate": "~", "xla-cpu": "c"}


def memory_line(result: Any) -> str | None:
    """The answer's predicted peak memory and the rows left out for it, in one line (None when no
    row has a peak)."""
    from disco.sim.memory import bytes_text

    row = result.row(result.chosen)
    over = [r.name for r in result.rows if r.over_memory is not None]
    if row.peak_memory_bytes is None and not over:
        return None
    how = {"xla": "XLA's memory analysis of its compiled module", "module-estimate": "estimated from its compiled "
           "module's buffers", "xla-cpu": "XLA:CPU's analysis of it compiled here, not the cluster's compiler's"}
    text = (f"peak memory per device (predicted): {bytes_text(row.peak_memory_bytes)}"
            + (f" ({how.get(row.memory_from or '', row.memory_from)})" if row.peak_memory_bytes is not None else ""))
    if result.memory_limit:
        text += f", limit {bytes_text(result.memory_limit)}"
    if over:
        text += f"; over the limit, never chosen: {', '.join(over)}"
    return text


def _cluster_note(info: dict[str, Any]) -> str:
    """" (<label>)" for the table's title: where the cluster's costs come from."""
    label = (info.get("cluster_spec") or {}).get("label")
    return f" ({label})" if label else ""


def _describe_costs(info: dict[str, Any]) -> str:
    c = info["cost_model_info"]
    if c["name"] == "gnn":
        return f"gnn (checkpoint {c['digest']}, {c['source']}, trained on {c.get('trained_on_samples')} samples)"
    return str(c["name"])


# the table's "(by)": where a row's prediction came from (disco.optimizer._accuracy.SOURCES), short
_SHORT_SOURCES = {"emulated": "emu", "corrected": "cor", "compiled": "cmp", "compiled-corrected": "cmp+cor",
                  "profiled": "prof", "gnn": "gnn"}


def print_table(result: Any, info: dict[str, Any]) -> None:
    from rich.markup import escape
    from rich.table import Table

    base_row = result.row("xla_default")
    baseline_rows = [r for r in result.rows if r.kind == "baseline" and r.name != "xla_default" and r.applied]
    best_base = max((r.gain(base_row) for r in baseline_rows), default=None)
    again = result.runoff.speedups if result.runoff is not None else {}
    lb = result.setting.lower_bound_s
    where = (f"{info['processes']} processes x {info['devices_per_process']} CPU devices over {info['over']} "
             "(a round's time: the slowest process's" if info.get("processes") else
             f"{info['devices']} devices ({info['device_kind']}")
    t = Table(title=(f"disco optimize {info['model']}/{info['preset']} on {where}"
                     f"; predicted by the simulator with the {_describe_costs(info)} "
                     "cost model on cluster "
                     f"{result.setting.cluster!r}{_cluster_note(info)}; measured, "
                     f"{counted(result.config.rounds, 'round')} x "
                     f"{counted(result.config.steps, 'step')})"))
    # headers cut over lines by hand, so that the table fits 120 columns (the legend below explains them)
    cols = ["plan", "from", "predicted\nms (by)", "measured ms\nmedian (min-max)", "speedup vs\nxla_default\n(paired)",
            "vs best\nbaseline", "peak\nmem"]
    cols += ["run-off\nspeedup"] if again else []
    for col in (*cols, "predicted /\nlower bound"):
        # the figures on one line each, the plan's name wrapped if need be; a cell still too wide folds, never cut
        t.add_column(col, overflow="fold", no_wrap=col != "plan")
    notes = Footnotes()  # a searched row's origin, under the table
    for r in result.ordered_rows():
        mark = " *" if r.name == result.chosen else ""
        meas = (f"{r.median_s * 1e3:.3f} ({r.min_s * 1e3:.3f}-{r.max_s * 1e3:.3f})"
                if r.median_s is not None else "-")
        if not r.applied:
            meas += "\nfell back"  # a line of its own: the column stays as wide as its figures
        cells = [escape(r.name) + mark, "baseline" if r.kind != "search" else notes.mark(r.origin), f"{r.predicted_s * 1e3:.3f} {_SHORT_SOURCES.get(r.predicted_by, r.predicted_by)}",
                 meas, f"{r.gain(base_row):.3f}x" if r.median_s else "-",
                 f"{r.gain(base_row) / best_base:.3f}x" if r.median_s and best_base else "-",
                 bytes_short(r.peak_memory_bytes) + ("!" if r.over_memory else "")]
        cells += [f"{again[r.name]:.3f}x" if r.name in again else "-"] if again else []
        t.add_row(*cells, f"{r.predicted_s / lb:.2f}x" if lb > 0 else "-")
    console = table_console()
    console.print(t)
    notes.print(console)
    for line in result.legend():
        print_note(console, line)
    limit = result.memory_limit
    print_note(console, "peak mem: bytes per device (K = KiB), measured: XLA's memory analysis of the plan's compiled "
                        "step (arguments + outputs - donated + temporaries); "
                        + (f"!: above the limit of {limit:,} bytes, measured but never chosen" if limit else
                           "no memory limit (--memory-limit, or a cluster's device_memory)"))
    print_note(console, "by: where the prediction came from, made before the plan was measured: emu the simulator "
                        "(emulated fusion, the cost model's kernel times), gnn its GNN kernel times, prof profiled "
                        "kernel times, cor the simulator through this machine's correction fitted from other "
                        "plans' measurements, cmp the compiled tier (the module XLA built for the plan, "
                        "--compiled-top-k), cmp+cor the compiled tier through the correction")
    s = result.search
    print_note(console, f"simulated lower bound {lb * 1e3:.3f} ms; search: {s.strategy}, {s.evals} plans "
                  f"in {s.seconds:.1f} s ({s.evals_per_s:.0f} evaluations/s)")
    print_note(console, result.accuracy.line())
    note = result.learning_note()
    if note:
        print_note(console, note)
    for label, times in (("run-off", result.runoff and result.runoff.times),
                         ("confirmation run", result.confirmation and result.confirmation.times)):
        if times is not None:
            line = ", ".join(f"{k} {v[0] * 1e3:.3f} ({v[1] * 1e3:.3f}-{v[2] * 1e3:.3f})" for k, v in times.items())
            if label == "confirmation run":
                c = result.confirmation
                line += f"; {c.candidate}'s paired speedup there {c.speedup:.3f}x"
                if c.baseline is not None:
                    line += f", the best baseline {c.baseline}'s {c.baseline_speedup:.3f}x"
                if c.vs_baseline is not None and c.vs_baseline_interval is not None:
                    lo, hi = c.vs_baseline_interval
                    line += f"; {c.candidate} {c.vs_baseline:.3f}x of {c.baseline} (90% interval {lo:.3f}-{hi:.3f})"
            print_note(console, f"{label} (ms, median (min-max)): {line}")
    note = result.bound_note()
    if note:
        print_note(console, note)
    print_verdict(console, result.verdict)
    print_note(console, f"the answer is {result.relation}")
    _print_plan_lines(console, result.chosen, result.rows)


def _print_plan_lines(console: Any, chosen: str, rows: Any) -> None:
    """The answer's plan, and the search's best (found as disco_1) when it is another, one line each."""
    for r in [next(r for r in rows if r.name == chosen)] + [r for r in rows if getattr(r, "found_as", "") == "disco_1"
                                                             and r.name != chosen]:
        p = r.plan
        opts = ", ".join(f"{k}={v}" for k, v in p.compile_options) or "XLA's defaults"
        print_note(console, f"{'chosen' if r.name == chosen else 'search best'} {r.name}: "
                      f"{counted(len(p.groups), 'fusion group')}, {counted(len(p.cuts), 'cut')}, "
                      f"{'XLA combiner' if p.buckets is None else counted(len(p.buckets), 'bucket')}"
                      f"; compile options: {opts}")


def measured_times(result: Any) -> tuple[str, dict[str, tuple[float, float, float]]]:
    """Where the plot's measured times come from and xla_default's and the answer's (median, min,
    max) seconds there: the confirmation run when there was one, else the first run."""
    if result.confirmation is not None:
        return "confirmation run", {n: tuple(v) for n, v in result.confirmation.times.items()}
    names = dict.fromkeys(("xla_default", result.chosen))
    return "first run", {n: (result.row(n).median_s, result.row(n).min_s, result.row(n).max_s) for n in names
                         if result.row(n).median_s is not None}


def plot_timelines(result: Any, path: str) -> None:
    """Writes :func:`draw_timelines`'s figure to ``path`` (PNG, or what the suffix names).

    Raises:
      CliError: when matplotlib is missing or the file cannot be written.
    """
    fig = draw_timelines(result)  # first: it says when matplotlib is missing
    import matplotlib.pyplot as plt

    try:
        fig.savefig(path, dpi=120)
    except OSError as e:
        raise CliError(f"cannot write --plot file {path!r}: {e.strerror}") from None
    finally:
        plt.close(fig)


def draw_timelines(result: Any) -> Any:
    """A matplotlib figure: xla_default's and the chosen plan's simulated compute/comm streams, one
    above the other, and below them their measured step times (median, min-max), each labelled right
    of its whisker, with a colour legend above the first panel.

    Raises:
      CliError: when matplotlib is missing.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        raise CliError("--plot needs matplotlib, which is not installed; `pip install matplotlib`") from None
    from disco.optimizer import chrome_trace

    panels = [("xla_default", chrome_trace(result, "xla_default"))]
    if result.chosen != "xla_default":
        panels.append((result.chosen, chrome_trace(result)))
    source, measured = measured_times(result)
    fig, axes = plt.subplots(len(panels) + 1, 1, figsize=(12, 2.2 * len(panels) + 2.2),
                             gridspec_kw={"height_ratios": [2] * len(panels) + [1.4]})
    colors = {0: "tab:blue", 1: "tab:orange"}
    for ax, (label, trace) in zip(axes, panels):
        for tid, stream in ((0, "compute"), (1, "comm")):
            spans = [(e["ts"] / 1e3, e["dur"] / 1e3) for e in trace["traceEvents"]
                     if e.get("ph") == "X" and e.get("tid") == tid]
            ax.broken_barh(spans, (1 - tid - 0.4, 0.8), facecolors=colors[tid], edgecolor="white", linewidth=0.3)
        ax.set_yticks([1, 0], ["compute", "comm"])
        step_ms = trace["otherData"]["step_time_s"] * 1e3
        meas = measured.get(label)
        real = f"; measured {meas[0] * 1e3:.3f} ms median ({source})" if meas else ""
        ax.set_title(f"{label}: {step_ms:.3f} ms simulated{real}", fontsize=10, loc="left")
        ax.set_xlabel("ms from the step's start (simulated timeline)", fontsize=8)
    axes[0].legend(handles=[Patch(color=colors[0], label="compute (kernels)"),
                            Patch(color=colors[1], label="communication (all-reduces)")],
                   loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=2, fontsize=8, frameon=False)
    ax = axes[-1]
    names = list(measured)
    med = [measured[n][0] * 1e3 for n in names]
    err = [[(measured[n][0] - measured[n][1]) * 1e3 for n in names],
           [(measured[n][2] - measured[n][0]) * 1e3 for n in names]]
    ax.barh(names, med, xerr=err, color=["tab:gray" if n == "xla_default" else "tab:green" for n in names],
            capsize=4)
    ends = [measured[n][2] * 1e3 for n in names]  # each label right of its bar's max, clear of the whisker
    for i, (v, end) in enumerate(zip(med, ends)):
        ax.text(end, i, f"  {v:.3f} ms", va="center", fontsize=8)
    ax.set_xlim(0, max(ends) * 1.18)
    ax.invert_yaxis()
    ax.set_xlabel(f"measured step time, ms (median, bars: min-max; {source}; answer {result.chosen}, "
                  f"{result.speedup:.3f}x paired)", fontsize=8)
    fig.tight_layout()
    return fig


# How the stages of a verdict begin after the first (disco.optimizer._choice):
# the run-off, the confirmation, and what was kept.
_VERDICT_STAGES = ("but ", "confirmed ", "the best again ", "keeping ", "the answer is ")


def verdict_stages(verdict: str) -> list[str]:
    """The verdict sentence cut into its stages (first run, run-off, confirmation), one per line.

    Cuts at a ``"; "`` outside parentheses that starts a stage (:data:`_VERDICT_STAGES`); the
    sentence is kept whole in ``--json`` and ``OptimizeResult.verdict``.

    Example:
      >>> for stage in verdict_stages("a measured 1.2x (x; but y); but b was the best in a run-off (b 1.3x); "
      ...                             "confirmed in a second run: 1.1x; the best baseline, c, 1.0x"):
      ...     print(stage)
      a measured 1.2x (x; but y)
      but b was the best in a run-off (b 1.3x)
      confirmed in a second run: 1.1x; the best baseline, c, 1.0x
    """
    parts, depth, start, i = [], 0, 0, 0
    while i < len(verdict):
        c = verdict[i]
        depth += (c == "(") - (c == ")")
        if depth == 0 and verdict.startswith("; ", i) and verdict.startswith(_VERDICT_STAGES, i + 2):
            parts.append(verdict[start:i])
            start = i + 2
        i += 1
    parts.append(verdict[start:])
    return parts


def print_verdict(console: Any, verdict: str) -> None:
    """``verdict:`` and the verdict's first stage, then each later stage on its own indented line."""
    first, *rest = verdict_stages(verdict)
    print_note(console, f"verdict: {first}", bold="verdict:")
    for stage in rest:
        print_note(console, stage, indent="  ")
