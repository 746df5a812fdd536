"""The JSON form of a plan: its schema version, its field vocabularies, and the pydantic model that checks it.

This module imports nothing from disco.plans: it checks the shape of a plan's JSON object and
returns the checked fields; :meth:`disco.plans.plan.FusionPlan.from_dict` builds the plan from
them. pydantic is imported on the first :func:`parse`, not with the data model.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, Literal, NamedTuple

SCHEMA_VERSION = 1
BucketBuild = Literal["tuple", "concat", "rs_ag", "scatter"]
BUILDS: tuple[str, ...] = ("tuple", "concat", "rs_ag", "scatter")
XlaFusion = Literal["off", "extend"]


class PlanFields(NamedTuple):
    """A plan's fields as checked JSON: plain tuples, ready for ``FusionPlan(**fields._asdict())``."""

    groups: tuple[tuple[str, ...], ...]
    xla_fusion: str
    buckets: tuple[tuple[tuple[str, ...], str], ...] | None  # (members, build) per bucket
    compile_options: tuple[tuple[str, str], ...]
    name: str
    graph_fingerprint: str | None = None  # absent in plans written before it was recorded
    cuts: tuple[tuple[str, str], ...] = ()  # (producer, consumer) pairs
    gather_buckets: tuple[tuple[str, ...], ...] | None = None  # all-gather names per bucket
    gather_after: tuple[tuple[str, str], ...] = ()  # (all-gather, anchor) pairs


@functools.cache
def _plan_model() -> Any:
    import pydantic

    class BucketModel(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid", strict=True)
        members: list[str] = pydantic.Field(min_length=1)
        build: BucketBuild = "concat"

    class PlanModel(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid", strict=True)
        schema_version: Literal[1]
        name: str = ""
        groups: list[list[str]] = []
        xla_fusion: XlaFusion = "extend"
        buckets: list[BucketModel] | None = None
        compile_options: dict[str, str] = {}
        graph_fingerprint: str | None = None
        # (producer, consumer) pairs; optional, so plans written before cuts existed still load.
        cuts: list[Annotated[list[str], pydantic.Field(min_length=2, max_length=2)]] = []
        # all-gather names per bucket; optional, so plans written before gather buckets existed still load.
        gather_buckets: list[Annotated[list[str], pydantic.Field(min_length=1)]] | None = None
        # (all-gather, anchor) pairs; optional, so plans written before gather anchors existed still load.
        gather_after: list[Annotated[list[str], pydantic.Field(min_length=2, max_length=2)]] = []

    return PlanModel


def _got(value: Any) -> str:
    """``value``'s repr cut to 80 characters: an error stays one line (a missing key's "input" is the
    whole plan object, which can be megabytes)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _first_error(e: Any) -> str:
    err = e.errors()[0]
    field = ".".join(str(p) for p in err["loc"]) or "<root>"
    return f"plan field {field!r}: {err['msg']} (got {_got(err.get('input'))})"


def parse(data: Any) -> PlanFields:
    """Checks a plan's JSON object.

    Raises:
      ValueError: naming the bad field, what it held and what was expected.
    """
    import pydantic

    if isinstance(data, dict) and data.get("schema_version") not in (None, SCHEMA_VERSION):
        raise ValueError(f"plan field 'schema_version': expected {SCHEMA_VERSION}, "
                         f"got {_got(data.get('schema_version'))}")
    try:
        m = _plan_model().model_validate(data)
    except pydantic.ValidationError as e:
        raise ValueError(_first_error(e)) from None
    return PlanFields(
        groups=tuple(tuple(g) for g in m.groups),
        xla_fusion=m.xla_fusion,
        buckets=None if m.buckets is None else tuple((tuple(b.members), b.build) for b in m.buckets),
        compile_options=tuple(sorted(m.compile_options.items())),
        name=m.name,
        graph_fingerprint=m.graph_fingerprint,
        cuts=tuple((p, c) for p, c in m.cuts),
        gather_buckets=None if m.gather_buckets is None else tuple(tuple(b) for b in m.gather_buckets),
        gather_after=tuple((g, a) for g, a in m.gather_after),
    )
