"""Fusion plans: op-fusion groups plus gradient buckets (and all-gather buckets), validated against a graph.

A plan is written against the *pre-optimisation* HLO of a step (the names in
:class:`disco.HloGraph`). It never changes what the step computes, only how
XLA groups the work: which instructions become one kLoop fusion, which
producer -> consumer edges XLA may not fuse across (cuts), which all-reduces are
merged into one, which all-gathers (a sharded step's parameter gathers) are merged into one,
how early each parameter gather may start (its anchor: the prefetch distance),
and which XLA compile options are set.

Inside the library a plan is a frozen dataclass; at the boundary (files, the
REST API, ``--json``) it is JSON checked by a pydantic model with a schema version.

Imports point one way: :mod:`disco.plans.check` (validation against a graph) and
:mod:`disco.plans.schema` (the JSON form) import nothing from this module at run time
(check names the plan type for type checkers only), so ``FusionPlan.validate`` and
``FusionPlan.from_dict`` call them without an import cycle.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from disco.plans import check as plan_check
from disco.plans import options as plan_options
from disco.plans import schema as plan_schema
from disco.plans.schema import BUILDS, SCHEMA_VERSION, BucketBuild, XlaFusion

if TYPE_CHECKING:
    from disco.ir.graph import HloGraph

__all__ = ["BUILDS", "SCHEMA_VERSION", "Bucket", "BucketBuild", "FusionPlan", "XlaFusion", "make_plan"]

# Compile-time passes a plan needs switched off, per backend.
_FUSION_PASSES = {"cpu": ("fusion", "reshape-mover"),
                  "gpu": ("priority-fusion", "multi_output_fusion", "reshape-mover")}
# GPU names checked against the passes an XLA:GPU compile runs (scripts/tools/check_gpu.py on an H100,
# jax 0.11.2): "all-reduce-combiner" is not among them, "gpu-all-reduce-combiner" is.
_COMBINER_PASSES = {"cpu": ("cpu-all-reduce-combiner",),
                    "gpu": ("gpu-all-reduce-combiner",)}
# XLA:CPU runs no all-gather combiner (jax 0.10.2: no such pass among those a compile of an fsdp step
# runs, and its compiled module keeps every all-gather); XLA:GPU's is named in XLA_NOTES (not run here).
_GATHER_COMBINER_PASSES = {"cpu": (), "gpu": ("gpu-all-gather-combiner",)}
# Passes that strip optimization barriers before fusion: XLA:CPU's OptimizationBarrierExpander
# (measured, jax 0.10.2: a barrier splits a fusion only with it off; jax 0.11.2 and 0.12.0.1 keep
# the barrier either way, so turning it off is harmless there). XLA:GPU keeps barriers through
# fusion (measured on an H100, jax 0.11.2: one fusion -> two, no flag).
_BARRIER_PASSES = {"cpu": ("cse_barrier_expander",), "gpu": ()}


_BOOLS = {"true": "True", "false": "False"}


def _names(value: Any) -> bool:
    """True for a tuple of strings (instruction names, or an option's key and value)."""
    return isinstance(value, tuple) and all(isinstance(v, str) for v in value)


def _all_names(values: tuple) -> bool:
    """True when every entry of ``values`` is a tuple of strings (:func:`_names` of each), checked
    by the set of the entries' types at C speed: a search makes thousands of plans whose groups
    hold thousands of names (a per-name check had been a seventh of its time, measured on CPU)."""
    if not all(issubclass(t, tuple) for t in set(map(type, values))):
        return False
    return all(issubclass(t, str) for t in set(map(type, itertools.chain.from_iterable(values))))


def _short(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 80 else text[:77] + '...'}"


@dataclasses.dataclass(frozen=True)
class Bucket:
    """All-reduces (by instruction name) merged into one collective.

    Attributes:
      members: all-reduce instruction names, in the order the bucket lays them out.
      build: "concat" (flatten, concatenate, one all-reduce, slice back; the
        default), "rs_ag" (flatten and concatenate as for concat, pad to a multiple of the
        replica group size, then a reduce-scatter and an all-gather in place of the
        all-reduce: the AllReduce = ReduceScatter + AllGather split of CoCoNet; each device
        reduces 1/p of the buffer instead of all of it), "scatter" (a sharded step's gradient
        scatters only, ``grad_scatter`` all-reduces whose every user is a dynamic-slice keeping this
        device's block, :mod:`disco.ir.scatter_blocks`: each member's gradient laid out as
        ``[p, n / p]`` rows by device, concatenated along dimension 1, one reduce-scatter along
        dimension 0, each member's block sliced back in place of its dynamic-slices; each device
        receives 1/p of the buffer and no all-gather follows) or "tuple" (one variadic
        all-reduce). jaxlib 0.10.2 cannot export
        a variadic all-reduce inside a shard_map body (measured: "Sharding is
        tuple-shaped but validation shape is not"), so validation rejects
        multi-member tuple buckets there.
    """

    members: tuple[str, ...]
    build: BucketBuild = "concat"

    def __post_init__(self) -> None:
        if not _names(self.members):
            raise TypeError(f"Bucket.members: expected a tuple of all-reduce instruction names, got {_short(self.members)}")
        if self.build not in BUILDS:
            raise ValueError(f"Bucket.build: expected one of {', '.join(BUILDS)}, got {self.build!r}")

    def __repr__(self) -> str:
        """One line: the member count, the first and last member, the build."""
        n, m = len(self.members), self.members
        span = "" if not m else f" {m[0][:40]!r}" if n == 1 else f" {m[0][:40]!r}..{m[-1][:40]!r}"
        return f"Bucket({n} member{'' if n == 1 else 's'}{span}, {self.build})"


@dataclasses.dataclass(frozen=True)
class FusionPlan:
    """A joint op-fusion and gradient-bucketing plan.

    Attributes:
      groups: disjoint sets of instruction names, each to become one kLoop fusion.
        XLA:GPU cannot take them (its PJRT plugin receives StableHLO, where ``mhlo.fusion``
        has no form): validation for backend "gpu" refuses a plan with groups.
      cuts: (producer, consumer) instruction-name pairs, the producer an operand of the
        consumer, that XLA may not fuse across: the consumer reads the producer through an
        optimization barrier. Valid on every backend.
      xla_fusion: "extend" lets XLA's fusion pass run after ours (it may grow our
        fusions); "off" disables it, so only planned fusions exist.
      buckets: ordered all-reduce groups; ``None`` leaves all-reduces to XLA's
        combiner (its default behaviour).
      gather_buckets: groups of all-gathers (a sharded step's parameter gathers, by instruction
        name), each merged into one all-gather of the members' concatenated shards, split back
        after; all-gathers in none stay as they are. ``None`` (the default) leaves all-gathers
        to XLA (on GPU its all-gather combiner, which a plan with gather buckets turns off).
      gather_after: (all-gather, anchor) instruction-name pairs: the parameter all-gather (a
        gather bucket's member: the whole bucket) may not start before the anchor's value exists
        (the prefetch distance of FSDP). The gather reads its shard through an optimization barrier
        together with the anchor's value (``opt-barrier((shard, anchor))``), so it depends on the
        anchor; the gathered parameter is then live from the anchor on instead of from the step's
        start. Valid on every backend (a barrier has a StableHLO form). Empty (the default): XLA may
        issue every gather at the step's start.
      compile_options: extra XLA compile options, as (key, value) pairs.
      name: a label (e.g. the baseline it came from).
      graph_fingerprint: the fingerprint of the graph the plan was made for
        (:attr:`disco.ir.graph.HloGraph.fingerprint`), or None (plans written before it was
        recorded); applying the plan to another graph warns and falls back, or raises with
        ``strict=True``. Like the name, it is not part of :meth:`digest`.
    """

    groups: tuple[tuple[str, ...], ...] = ()
    xla_fusion: XlaFusion = "extend"
    buckets: tuple[Bucket, ...] | None = None
    compile_options: tuple[tuple[str, str], ...] = ()
    name: str = ""
    graph_fingerprint: str | None = None
    cuts: tuple[tuple[str, str], ...] = ()
    gather_buckets: tuple[tuple[str, ...], ...] | None = None
    gather_after: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        """Checks the fields' types (a list or a str where a tuple belongs would hash, compare and
        serialise wrongly); :func:`make_plan` builds a plan from lists."""
        hint = " (make_plan builds a plan from lists)"
        if not isinstance(self.groups, tuple) or not _all_names(self.groups):
            raise TypeError(f"FusionPlan.groups: expected a tuple of tuples of instruction names, "
                            f"got {_short(self.groups)}{hint}")
        if self.xla_fusion not in ("off", "extend"):
            raise ValueError(f"FusionPlan.xla_fusion: expected 'off' or 'extend', got {self.xla_fusion!r}")
        if self.buckets is not None and (not isinstance(self.buckets, tuple)
                                         or not all(isinstance(b, Bucket) for b in self.buckets)):
            raise TypeError(f"FusionPlan.buckets: expected None or a tuple of Bucket, got {_short(self.buckets)}{hint}")
        if self.gather_buckets is not None and (not isinstance(self.gather_buckets, tuple)
                                                or not _all_names(self.gather_buckets)):
            raise TypeError(f"FusionPlan.gather_buckets: expected None or a tuple of tuples of all-gather names, "
                            f"got {_short(self.gather_buckets)}{hint}")
        for field, what in (("compile_options", "(key, value) string pairs"), ("cuts", "(producer, consumer) name pairs"),
                            ("gather_after", "(all-gather, anchor) name pairs")):
            value = getattr(self, field)
            if not isinstance(value, tuple) or not all(_names(p) and len(p) == 2 for p in value):
                raise TypeError(f"FusionPlan.{field}: expected a tuple of {what}, got {_short(value)}{hint}")
        if not isinstance(self.name, str) or not isinstance(self.graph_fingerprint, (str, type(None))):
            raise TypeError(f"FusionPlan.name and graph_fingerprint: expected str (graph_fingerprint also None), "
                            f"got {type(self.name).__name__} and {type(self.graph_fingerprint).__name__}")

    def __repr__(self) -> str:
        """One line of counts (``to_json()`` and :meth:`summary` for the rest)."""
        parts = [_count(len(self.groups), "group"),
                 "XLA's combiner" if self.buckets is None else _count(len(self.buckets), "bucket"),
                 _count(len(self.cuts), "cut")]
        if self.xla_fusion != "extend":
            parts.append(f"xla_fusion={self.xla_fusion!r}")
        if self.gather_buckets is not None:
            parts.append(_count(len(self.gather_buckets), "gather bucket"))
        if self.gather_after:
            parts.append(_count(len(self.gather_after), "gather anchor"))
        if self.compile_options:
            parts.append(f"{len(self.compile_options)} compile options")
        if self.graph_fingerprint is not None:
            parts.append(f"for graph {self.graph_fingerprint[:8]}")
        return f"FusionPlan({self.name[:40]!r}, {', '.join(parts)})"

    # -- predicates ----------------------------------------------------------------------------
    @property
    def is_default(self) -> bool:
        """True when the plan asks for nothing beyond XLA's default compile."""
        return (not self.groups and self.xla_fusion == "extend" and self.buckets is None
                and not self.compile_options and not self.cuts and self.gather_buckets is None
                and not self.gather_after)

    def disabled_passes(self, backend: str = "cpu") -> tuple[str, ...]:
        """XLA passes to disable when compiling this plan on ``backend`` ("cpu" or "gpu")."""
        backend = plan_options.normalize(backend)
        passes: list[str] = []
        if self.groups or self.xla_fusion == "off":
            passes += _FUSION_PASSES[backend] if self.xla_fusion == "off" else ("reshape-mover",)
        if self.buckets is not None:
            passes += _COMBINER_PASSES[backend]
        if self.gather_buckets is not None:
            passes += _GATHER_COMBINER_PASSES[backend]
        if self.cuts or self.gather_after:  # both are optimization barriers
            passes += _BARRIER_PASSES[backend]
        return tuple(dict.fromkeys(passes))

    def compiler_options(self, backend: str = "cpu") -> dict[str, str | int]:
        """The options for ``Lowered.compile``: the plan's own, plus the passes it needs off.

        Boolean values are spelled as XLA parses them ("True"/"False"): jaxlib 0.10.2 rejects
        "true", "false", "0" and "1" (measured), which JSON plans naturally contain. An
        ``optimization_level`` is given as XLA's effort-level number (jax 0.10.2 rejects "O1").
        """
        opts: dict[str, str | int] = {
            k: plan_options.EFFORT_LEVEL_NUMBERS.get(v, v) if k == plan_options.OPTIMIZATION_LEVEL else _BOOLS.get(v.lower(), v)
            for k, v in self.compile_options}
        passes = list(self.disabled_passes(backend))
        if passes:
            extra = [p for p in opts.get("xla_disable_hlo_passes", "").split(",") if p]
            opts["xla_disable_hlo_passes"] = ",".join(dict.fromkeys(extra + passes))
        return opts

    # -- transformations -----------------------------------------------------------------------
    def replace(self, **kw: Any) -> FusionPlan:
        return dataclasses.replace(self, **kw)

    def derive(self, **kw: Any) -> FusionPlan:
        """:meth:`replace` without ``__post_init__``'s type checks, for code whose new fields are
        tuples made only of this plan's own (checked) entries and of the graph's instruction names
        (:mod:`disco.plans.moves`): a search makes thousands of plans whose groups hold thousands
        of names, and the checks had been a tenth of its time (measured on CPU). The moves' tests
        check that every plan they make passes the checks.

        Raises:
          TypeError: for a name that is not a field.
        """
        unknown = sorted(set(kw).difference(_FIELDS))
        if unknown:
            raise TypeError(f"FusionPlan.derive: unknown fields {unknown}; expected some of {sorted(_FIELDS)}")
        out = object.__new__(FusionPlan)
        for name in _FIELDS:
            object.__setattr__(out, name, kw[name] if name in kw else getattr(self, name))
        return out

    # -- serialisation -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The JSON object form; ``cuts`` appears only when there are some, so a plan without
        cuts keeps the form (and the digest) it had before cuts existed."""
        out = {
            "schema_version": SCHEMA_VERSION,
            "name": self.name,
            "groups": [list(g) for g in self.groups],
            "xla_fusion": self.xla_fusion,
            "buckets": None if self.buckets is None else [
                {"members": list(b.members), "build": b.build} for b in self.buckets],
            "compile_options": {k: v for k, v in self.compile_options},
            # written only when known, so plans without one keep their JSON (and older readers)
            **({"graph_fingerprint": self.graph_fingerprint} if self.graph_fingerprint else {}),
        }
        if self.cuts:
            out["cuts"] = [list(c) for c in self.cuts]
        if self.gather_buckets is not None:  # written only when set, as cuts: older plans keep their digest
            out["gather_buckets"] = [list(b) for b in self.gather_buckets]
        if self.gather_after:  # written only when set, as cuts
            out["gather_after"] = [list(p) for p in self.gather_after]
        return out

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True)

    @classmethod
    def from_dict(cls, data: Any) -> FusionPlan:
        """Reads a plan from its JSON object form.

        Raises:
          ValueError: naming the field that is missing or wrong.
        """
        f = plan_schema.parse(data)
        return cls(groups=f.groups, xla_fusion=f.xla_fusion,  # type: ignore[arg-type]
                   buckets=None if f.buckets is None else tuple(Bucket(m, b) for m, b in f.buckets),  # type: ignore[arg-type]
                   compile_options=f.compile_options, name=f.name, graph_fingerprint=f.graph_fingerprint,
                   cuts=f.cuts, gather_buckets=f.gather_buckets, gather_after=f.gather_after)

    @classmethod
    def from_json(cls, text: str | bytes) -> FusionPlan:
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as e:  # also a number too long to convert, or too deep
            raise ValueError(f"plan is not valid JSON: {e}") from None
        return cls.from_dict(data)

    def digest(self) -> str:
        """A stable hash of what the plan asks for (the name and graph fingerprint are left out)."""
        d = self.to_dict()
        d.pop("name")
        d.pop("graph_fingerprint", None)
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]

    # -- checks --------------------------------------------------------------------------------
    def validate(self, graph: HloGraph, backend: str = "cpu") -> FusionPlan:
        """Checks the plan against ``graph`` for ``backend``; returns the plan so calls can chain.

        Args:
          graph: the step's pre-optimisation graph.
          backend: "cpu" or "gpu" (or a jax platform name): on GPU fusion groups are refused.

        Raises:
          ValueError: saying which group, cut, bucket or option is wrong and why (for a
            cycle, the path that would form it).
        """
        plan_check.validate(self, graph, backend)
        return self

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "groups": len(self.groups),
            "grouped_ops": sum(len(g) for g in self.groups),
            "xla_fusion": self.xla_fusion,
            "buckets": None if self.buckets is None else len(self.buckets),
            "cuts": len(self.cuts),
            **({"gather_buckets": len(self.gather_buckets)} if self.gather_buckets is not None else {}),
            **({"gather_anchors": len(self.gather_after)} if self.gather_after else {}),
            "compile_options": dict(self.compile_options),
            "digest": self.digest(),
        }


_FIELDS = tuple(f.name for f in dataclasses.fields(FusionPlan))  # in declaration order


def _count(n: int, what: str) -> str:
    """``n`` and ``what``, plural unless ``n`` is 1: "1 bucket", "3 buckets"."""
    return f"{n} {what}{'' if n == 1 else 's'}"


def decisions(plan: FusionPlan, relative_to: FusionPlan | None = None) -> tuple[str, ...]:
    """What ``plan`` decides apart from its buckets, as phrases ("1 fusion group", "2 fusion cuts",
    "XLA's fusion off", "compile options (k=v)"); with ``relative_to``, only where the two differ.
    Empty: XLA's defaults (or nothing beyond ``relative_to``)."""
    base = relative_to if relative_to is not None else FusionPlan()
    parts = []
    if plan.groups != base.groups:
        parts.append(_count(len(plan.groups), "fusion group"))
    if plan.cuts != base.cuts:
        parts.append(_count(len(plan.cuts), "fusion cut"))
    if plan.xla_fusion != base.xla_fusion:
        parts.append(f"XLA's fusion {plan.xla_fusion}")
    if plan.gather_buckets != base.gather_buckets:
        parts.append("XLA's all-gathers" if plan.gather_buckets is None
                     else _count(len(plan.gather_buckets), "gather bucket"))
    if plan.gather_after != base.gather_after:
        parts.append(_count(len(plan.gather_after), "gather anchor") if plan.gather_after else "gathers unanchored")
    if plan.compile_options != base.compile_options:
        shown = ", ".join(f"{k}={v}" for k, v in plan.compile_options) or "XLA's defaults"
        parts.append(f"compile options ({shown})")
    return tuple(parts)


def _name_lists(field: str, value: Any) -> list[Any]:
    """``value`` as a list, refusing a str where lists of names belong (it would split into letters)."""
    items = None if isinstance(value, str) else list(value)
    if items is None or any(isinstance(v, str) for v in items):
        raise TypeError(f"make_plan: {field}: expected lists of instruction names, got {_short(value)}")
    return items


def make_plan(
    groups: Iterable[Sequence[str]] = (),
    buckets: Iterable[Sequence[str]] | None = None,
    *,
    build: BucketBuild = "concat",
    xla_fusion: XlaFusion = "extend",
    name: str = "",
    cuts: Iterable[Sequence[str]] = (),
    compile_options: Mapping[str, str] | None = None,
    gather_buckets: Iterable[Sequence[str]] | None = None,
    gather_after: Iterable[Sequence[str]] = (),
) -> FusionPlan:
    """Convenience constructor from plain lists.

    Raises:
      TypeError: for a str where a list of names belongs (it would be split into letters).
    """
    groups, cuts = _name_lists("groups", groups), _name_lists("cuts", cuts)
    buckets = None if buckets is None else _name_lists("buckets", buckets)
    gather_buckets = None if gather_buckets is None else _name_lists("gather_buckets", gather_buckets)
    gather_after = _name_lists("gather_after", gather_after)
    return FusionPlan(
        groups=tuple(tuple(g) for g in groups),
        xla_fusion=xla_fusion,
        buckets=None if buckets is None else tuple(Bucket(tuple(b), build) for b in buckets),
        name=name,
        cuts=tuple((str(p), str(c)) for p, c in cuts),
        compile_options=tuple(sorted((compile_options or {}).items())),
        gather_buckets=None if gather_buckets is None else tuple(tuple(b) for b in gather_buckets),
        gather_after=tuple((str(g), str(a)) for g, a in gather_after),
    )
