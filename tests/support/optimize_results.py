"""Optimize results built by hand (no compile, no measurement), for the tests of the printed table, the
CLI and the reprs."""

from __future__ import annotations

from disco import optimizer as opt
from disco.optimizer import _choice  # noqa: F401 - opt._choice below, loaded whatever ran before
from disco.plans.plan import FusionPlan
from xla_hooks.measure import Measurement


def row(name, median, lo=None, hi=None, applied=True, speedup=None):
    return opt.PlanRow(name, "baseline", name, FusionPlan(name=name), 1e-3, median,
                       median if lo is None else lo, median if hi is None else hi, applied, speedup=speedup)


def m(*samples):
    return Measurement(tuple(samples))


def built_result():
    """A result built by hand: ddp chosen at 1.30x, confirmed at 1.25x, no run-off."""
    rows = (row("xla_default", 0.100, 0.090, 0.120, speedup=1.0), row("ddp", 0.080, 0.070, 0.090, speedup=1.30),
            row("horovod", 0.079, 0.070, 0.095, speedup=1.20))
    span = opt.Span
    return opt.OptimizeResult(
        plan=rows[1].plan, chosen="ddp", verdict="ddp measured 1.300x faster", rows=rows,
        setting=opt.Setting(graph={"name": "jit_step", "fingerprint": "0123456789abcdef", "nodes": 10,
                                   "all_reduces": 3}, cluster="local", cost_model="analytic", lower_bound_s=5e-4),
        search=opt.SearchSummary("best_first", 10, 5.0, 2.0, ()), config=opt.OptimizeConfig(rounds=9, steps=3),
        bound=opt.Bound(span(0.06, 0.05, 0.07), 1.6),
        confirmation=opt.Confirmation("ddp", "ddp", "ddp measured 1.300x faster; confirmed",
                                      {"xla_default": span(0.1, 0.09, 0.11), "ddp": span(0.08, 0.07, 0.09)}, 1.25))


def contradicting_result():
    """The run the issue quotes, built with the real choice rules: in the first run horovod leads and
    the ranges overlap; ddp wins the run-off and is confirmed at 1.369x; the bound is 1.058x."""
    rows = (row("xla_default", 0.100, 0.090, 0.120, speedup=1.0), row("horovod", 0.078, 0.070, 0.095, speedup=1.30),
            row("ddp", 0.080, 0.072, 0.096, speedup=1.20), row("per_tensor", 0.11, 0.10, 0.12, speedup=0.9))
    chosen, why = opt._choice.verdict(rows)
    again = {"xla_default": m(1.0, 1.0, 1.0), "horovod": m(0.9, 0.9, 0.9), "ddp": m(0.78, 0.78, 0.78)}
    chosen, why = opt._choice.runoff_choice(chosen, why, again)
    confirm = {"xla_default": m(0.1369, 0.1369, 0.1369), "ddp": m(0.1, 0.1, 0.1)}
    final, why, gain, *_ = opt._choice.confirmed_choice(chosen, why, confirm)
    span = opt.Span
    return opt.OptimizeResult(
        plan=rows[2].plan, chosen=final, verdict=why, rows=rows,
        setting=opt.Setting(graph={"name": "jit_step", "fingerprint": "0123456789abcdef", "nodes": 10,
                                   "all_reduces": 3}, cluster="local", cost_model="analytic", lower_bound_s=5e-4),
        search=opt.SearchSummary("best_first", 10, 5.0, 2.0, ()), config=opt.OptimizeConfig(rounds=3, steps=1),
        bound=opt.Bound(span(0.0945, 0.09, 0.1), 1.058),
        runoff=opt.RunOff(chosen, "", {n: opt.Span.of(v) for n, v in again.items()},
                          {"horovod": 1 / 0.9, "ddp": 1 / 0.78}),
        confirmation=opt.Confirmation("ddp", final, why, {n: opt.Span.of(v) for n, v in confirm.items()}, gain))
