"""The answer first: what ``optimize`` chose and why it can be trusted, in a few lines.

:func:`answer` reads an :class:`~disco.optimizer.OptimizeResult` into an :class:`Answer` (what
was chosen, in words; its measured speedups over XLA's default and over the best baseline with
their 90% intervals; where it came from; how well the model ranked); :func:`answer_lines` writes
it as at most :data:`MAX_LINES` lines of at most :data:`WIDTH` columns, ending with the lines of
Python that apply the plan. ``disco optimize`` prints them last and ``OptimizeResult.summary()``
returns them; the tables and diagnostics are ``--details`` (``summary(details=True)``).
"""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING, Any, NamedTuple

from disco.plans.naming import describe

if TYPE_CHECKING:
    from disco.optimizer._result import OptimizeResult

MAX_LINES = 15
WIDTH = 100


class Answer(NamedTuple):
    """The answer of a measured run, read from its result.

    Attributes:
      chosen: the answer's row name (a plan's name by content, a baseline's name, or xla_default).
      plan: what the plan does, in words (:func:`disco.plans.naming.describe`).
      source: where it came from: "search", "run-off" (the search's fusion on a baseline's buckets,
        measured in the run-off), "baseline", "sweep" (``even_<k>``), "reference" (reduce_fusion, a
        projection) or "default" (xla_default: nothing beat it).
      origin: the row's origin phrase, and the name it had in the search's order.
      vs_default: the measured paired speedup over xla_default (confirmed when confirmed).
      vs_default_interval: its 90% bootstrap interval in the confirmation run, or None.
      baseline: the first run's best baseline (xla_default when none beat it).
      vs_baseline: the answer's paired speedup over that baseline in the confirmation (1.0 when the
        answer is that baseline), or None.
      vs_baseline_interval: its 90% interval, or None.
      confirmed: whether a confirmation run in fresh rounds measured it.
      rounds: the rounds behind ``vs_default`` (the confirmation's, else the first run's).
      model: :meth:`~disco.optimizer._accuracy.Accuracy.decision_line`.
    """

    chosen: str
    plan: str
    source: str
    origin: str
    vs_default: float
    vs_default_interval: tuple[float, float] | None
    baseline: str
    vs_baseline: float | None
    vs_baseline_interval: tuple[float, float] | None
    confirmed: bool
    rounds: int
    model: str

    def to_dict(self) -> dict[str, Any]:
        d = self._asdict()
        for k in ("vs_default_interval", "vs_baseline_interval"):
            d[k] = None if d[k] is None else list(d[k])
        return d


def _source(result: OptimizeResult) -> tuple[str, str]:
    if result.chosen == "xla_default":
        return "default", "no plan measured faster than XLA's default compile"
    r = result.row(result.chosen)
    found = f", found as {r.found_as}" if r.found_as and r.found_as != r.name else ""
    if r.kind == "baseline":
        return ("sweep", f"the bucket sweep: {r.origin}") if r.name.startswith("even_") else \
            ("baseline", f"the baseline {r.name}")
    if r.measured_in == "run-off":
        return "run-off", f"the run-off ({r.origin}{found})"
    if r.origin.startswith("searched"):
        return "search", f"the search ({r.origin}{found})"
    return "reference", ", ".join(part for part in (r.origin, found.removeprefix(", ")) if part)


def answer(result: OptimizeResult) -> Answer:
    """The :class:`Answer` of ``result``."""
    source, origin = _source(result)
    c = result.confirmation
    interval = result.confirmed_interval
    rounds = result.config.confirmation_rounds if c is not None else result.config.rounds
    graph = result.simulator.graph if result.simulator is not None else None
    # the baseline the confirmation measured beside the answer (the first run's best), else the first run's
    baseline = c.baseline if c is not None and c.baseline is not None else result.best_baseline
    return Answer(result.chosen, describe(result.plan, graph), source, origin, result.speedup, interval,
                  baseline, result.confirmed_vs_best_baseline,
                  result.confirmed_vs_best_baseline_interval, c is not None, rounds,
                  result.accuracy.decision_line())


def _noise(interval: tuple[float, float] | None, confirmed: bool = True) -> str:
    if interval is None:
        return "no interval: " + ("the run kept no per-round times" if confirmed else "no confirmation run")
    lo, hi = interval
    verdict = "beyond noise" if lo > 1.0 or hi < 1.0 else "within noise"
    return f"90% interval {lo:.3f}-{hi:.3f}: {verdict}"


def apply_snippet(plan_file: str) -> list[str]:
    """The lines of Python that apply the plan kept in ``plan_file`` to a training script's
    ``step`` (plain or jitted) and its example ``args``."""
    return ["import pathlib, disco, xla_hooks",
            f"path = {plan_file!r}",
            "step = xla_hooks.apply(disco.FusionPlan.from_json(pathlib.Path(path).read_text()), step, *args)"]


def answer_lines(result: OptimizeResult, *, title: str, measured_on: str, plan_file: str | None = None,
                 more: str = "--details for every plan and the diagnostics, --json for everything",
                 width: int = WIDTH, command: str = "disco optimize") -> list[str]:
    """The answer in at most :data:`MAX_LINES` lines of at most ``width`` columns.

    Args:
      result: a measured run's result.
      title: what was optimised ("mlp/small, 8 devices").
      measured_on: where it was measured ("CPU", "GPU"): every figure says so.
      plan_file: where the plan was written (the snippet reads it), or None (not written).
      more: the last line: where the rest is.
      command: what the first line names (``disco.optimize`` from Python).
    """
    a = answer(result)
    out: list[str] = []

    def add(text: str, indent: str = "  ") -> None:
        # a word longer than a line (a plan's origin can chain names) is cut: no line is ever wider
        out.extend(textwrap.wrap(text, width=width, initial_indent=indent, subsequent_indent=indent + "  ",
                                 break_on_hyphens=False, break_long_words=True))

    add(f"{command} {title}: the answer is {a.chosen}", indent="")
    add(f"what it does: {a.plan}")
    add(f"from: {a.origin}")
    if a.chosen == "xla_default":
        add(f"measured on {measured_on}: no plan beat XLA's default, so there is nothing to apply")
    else:
        run = "in the confirmation's fresh rounds" if a.confirmed else "in the first run"
        add(f"measured on {measured_on} {run} ({a.rounds} rounds):")
        add(f"{a.vs_default:.3f}x faster than XLA's default ({_noise(a.vs_default_interval, a.confirmed)})",
            indent="    ")
        if a.baseline == "xla_default":
            add("no baseline beat XLA's default in the first run", indent="    ")
        elif a.baseline == a.chosen:
            add(f"the answer is the best baseline itself ({a.chosen})", indent="    ")
        elif a.vs_baseline is not None:
            add(f"{a.vs_baseline:.3f}x the speed of the best baseline, {a.baseline} "
                f"({_noise(a.vs_baseline_interval, a.confirmed)})", indent="    ")
        else:
            b = result.row(a.baseline).gain(result.row("xla_default"))
            add(f"the best baseline, {a.baseline}, measured {b:.3f}x over XLA's default in the first run",
                indent="    ")
    add(a.model)
    if plan_file is not None and a.chosen != "xla_default":
        add("the plan is written to path; to apply it in a training script:")
        out.extend("    " + line for line in apply_snippet(plan_file))
    elif plan_file is not None:
        add(f"written to {plan_file} (XLA's default: applying it changes nothing)")
    if len(out) < MAX_LINES:
        add(more)
    return out
