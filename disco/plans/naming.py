"""Plans named and described by what they do, not by where a search found them.

:func:`content_name` is a pure function of what a plan asks for (its buckets, fusion groups, cuts,
XLA's fusion and compile options), so the same plan gets the same name in every run and on every
machine: ``b3_g2_ynn-noreduce_5f3a9c`` is 3 gradient buckets, 2 fusion groups and reductions kept
out of YNNPACK, ``5f3a9c`` the start of its :meth:`~disco.plans.plan.FusionPlan.digest` (two plans
of the same counts differ there). :func:`describe` says the same in words for the report, with the
buckets' sizes when the graph is given.

Example:
  >>> from disco.plans.plan import Bucket, FusionPlan
  >>> plan = FusionPlan(buckets=(Bucket(("ar.1", "ar.2")), Bucket(("ar.3",))), groups=(("a", "b"),))
  >>> content_name(plan).rsplit("_", 1)[0]
  'b2_g1'
  >>> describe(plan)
  '2 gradient buckets, 1 fusion group'
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from disco.plans import options as plan_options

if TYPE_CHECKING:
    from disco.ir.graph import HloGraph
    from disco.plans.plan import FusionPlan

DIGEST_CHARS = 6  # of the digest in a name: two plans of one run share a name with odds of ~1e-6
_BUILD_TAGS = {"concat": "", "rs_ag": "rs", "tuple": "t", "scatter": "sc"}
_YNN_TAGS = {plan_options.YNN_NO_REDUCE: "ynn-noreduce", plan_options.YNN_DEFAULT: "ynn-default"}
_YNN_WORDS = {plan_options.YNN_NO_REDUCE: "reductions kept out of YNNPACK",
              plan_options.YNN_DEFAULT: "XLA:CPU's default YNNPACK ops"}
_MB = 1 << 20
_PIPELINE = "xla_gpu_pipeline_"


def _option_tag(key: str, value: str) -> str:
    """A compile option in a few characters: ``ynn-noreduce``, ``thr64m``, ``lhs``, ``o1``."""
    if key == plan_options.YNN_FUSION_TYPE:
        return _YNN_TAGS.get(value, "ynn-" + "-".join(v.removeprefix("LIBRARY_FUSION_TYPE_").lower()
                                                       for v in value.split(",") if v))
    if key == plan_options.THRESHOLD:
        return f"thr{int(value) // _MB}m" if value.isdigit() else f"thr{value}"
    if key == plan_options.SCHEDULER:
        return "lhs" if value.lower() in ("true", "1") else "nolhs"
    if key == plan_options.OPTIMIZATION_LEVEL:
        return value.lower()
    if key in plan_options.PIPELINE_KEYS:
        return "pipe" + "".join(w[0] for w in key.removeprefix(_PIPELINE).split("_")) + "-" + (
            value.removeprefix("COLLECTIVE_PIPELINING_MODE_").lower())
    if key == plan_options.DOUBLE_BUFFERING:
        return "dbuf" if value.lower() in ("true", "1") else "nodbuf"
    words = key.removeprefix("xla_").removeprefix("gpu_").removeprefix("cpu_").split("_")
    return "".join(w[:3] for w in words) + ("" if value.lower() in ("true", "1") else f"-{value.lower()[:8]}")


def _option_words(key: str, value: str) -> str:
    if key == plan_options.YNN_FUSION_TYPE:
        return _YNN_WORDS.get(value, f"YNNPACK ops {value.replace('LIBRARY_FUSION_TYPE_', '').lower()}")
    if key == plan_options.THRESHOLD and value.isdigit():
        return f"XLA's combiner up to {int(value) / _MB:.0f} MB"
    if key == plan_options.SCHEDULER:
        return "the latency-hiding scheduler " + ("on" if value.lower() in ("true", "1") else "off")
    if key == plan_options.OPTIMIZATION_LEVEL:
        return f"optimization level {value}"
    if key in plan_options.PIPELINE_KEYS:
        what = key.removeprefix(_PIPELINE).replace("_", "-")
        return f"XLA's {what} pipelining {value.removeprefix('COLLECTIVE_PIPELINING_MODE_').lower()}"
    if key == plan_options.DOUBLE_BUFFERING:
        return "double-buffered loops " + ("on" if value.lower() in ("true", "1") else "off")
    return f"{key}={value}"


def _bucket_tag(plan: FusionPlan) -> str:
    if plan.buckets is None:
        return "bxla"  # XLA's all-reduce combiner decides
    builds = {b.build for b in plan.buckets}
    tag = _BUILD_TAGS.get(next(iter(builds)), "") if len(builds) == 1 else "mix"
    return f"b{len(plan.buckets)}{tag}"


def content_name(plan: FusionPlan) -> str:
    """The plan's name by content: its parts joined by ``_``, then the first :data:`DIGEST_CHARS`
    of its digest.

    The parts: ``b<n>`` for n gradient buckets (``rs`` appended for reduce-scatter + all-gather
    builds, ``t`` for variadic ones, ``mix`` for several kinds), ``bxla`` for XLA's combiner;
    ``g<n>`` fusion groups and ``c<n>`` fusion cuts when there are some; ``ag<n>`` for n gather
    buckets (a step with sharded parameters) when the plan sets them, ``pf<n>`` for n gather anchors
    (:attr:`~disco.plans.plan.FusionPlan.gather_after`: the prefetch distance); ``nofuse`` when XLA's
    fusion is off; a tag per compile option (``ynn-noreduce``: reductions out of YNNPACK, ``thr64m``:
    XLA:GPU's combine threshold, ``lhs``: the latency-hiding scheduler, ``o1``: an optimization level).
    The name and graph fingerprint do not count, as in the digest.
    """
    parts = [_bucket_tag(plan)]
    if plan.groups:
        parts.append(f"g{len(plan.groups)}")
    if plan.cuts:
        parts.append(f"c{len(plan.cuts)}")
    if plan.gather_buckets is not None:
        parts.append(f"ag{len(plan.gather_buckets)}")
    if plan.gather_after:
        parts.append(f"pf{len(plan.gather_after)}")
    if plan.xla_fusion == "off":
        parts.append("nofuse")
    parts += [_option_tag(k, v) for k, v in sorted(plan.compile_options)]
    return "_".join(parts) + "_" + plan.digest()[:DIGEST_CHARS]


def _size(n: float) -> str:
    """Bytes in a few characters: "34 MB", "2.1 MB", "72 kB", "96 B" (10^3 steps)."""
    for unit, scale in (("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            v = n / scale
            return f"{v:.0f} {unit}" if v >= 10 else f"{v:.1f} {unit}"
    return f"{n:.0f} B"


def bucket_sizes(plan: FusionPlan, graph: HloGraph) -> list[int]:
    """The bytes each of the plan's buckets reduces (its members' gradient bytes), in order; [] for
    XLA's combiner. A member the graph does not hold counts 0."""
    if plan.buckets is None:
        return []
    size = {n.name: n.grad_bytes for n in graph.all_reduces()}
    return [sum(size.get(m, 0) for m in b.members) for b in plan.buckets]


def describe(plan: FusionPlan, graph: HloGraph | None = None) -> str:
    """What the plan does, in words: "3 gradient buckets of 21-34 MB, 2 fusion groups, reductions
    kept out of YNNPACK"; "XLA's default compile" for a plan that asks for nothing. With ``graph``,
    the buckets' sizes (kB and MB: 10^3 and 10^6 bytes)."""
    if plan.is_default:
        return "XLA's default compile"
    parts = []
    if plan.buckets is None:
        parts.append("XLA's all-reduce combiner")
    else:
        n = len(plan.buckets)
        text = f"{n} gradient bucket{'' if n == 1 else 's'}"
        sizes = bucket_sizes(plan, graph) if graph is not None else []
        if sizes and max(sizes) > 0:
            lo, hi = _size(min(sizes)), _size(max(sizes))
            if lo == hi:
                text += f" of {lo}"
            elif lo.split()[1] == hi.split()[1]:  # one unit: "21-34 MB"
                text += f" of {lo.split()[0]}-{hi}"
            else:
                text += f" of {lo} to {hi}"
        builds = {b.build for b in plan.buckets}
        if builds == {"rs_ag"}:
            text += " (reduce-scatter + all-gather)"
        elif builds == {"tuple"}:
            text += " (variadic all-reduces)"
        elif builds == {"scatter"}:
            text += " (reduce-scatters)"
        parts.append(text)
    for count, what in ((len(plan.groups), "fusion group"), (len(plan.cuts), "fusion cut")):
        if count:
            parts.append(f"{count} {what}{'' if count == 1 else 's'}")
    if plan.gather_buckets is not None:
        n = len(plan.gather_buckets)
        parts.append(f"{n} gather bucket{'' if n == 1 else 's'}" if n else "each all-gather alone")
    if plan.gather_after:
        n = len(plan.gather_after)
        parts.append(f"{n} all-gather{' waits' if n == 1 else 's wait'} for an anchor (prefetch distance)")
    if plan.xla_fusion == "off":
        parts.append("XLA's own fusion off")
    parts += [_option_words(k, v) for k, v in sorted(plan.compile_options)]
    return ", ".join(parts)
