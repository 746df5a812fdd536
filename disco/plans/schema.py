"""The JSON boundary of a FusionPlan: a pydantic model with a schema version."""

from __future__ import annotations

from typing import Any, Literal

import pydantic

from disco.plans.plan import SCHEMA_VERSION, Bucket, FusionPlan


class BucketModel(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", strict=True)
    members: list[str] = pydantic.Field(min_length=1)
    build: Literal["tuple", "concat", "rs_ag"] = "concat"


class PlanModel(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", strict=True)
    schema_version: Literal[1]
    name: str = ""
    groups: list[list[str]] = []
    xla_fusion: Literal["off", "extend"] = "extend"
    buckets: list[BucketModel] | None = None
    compile_options: dict[str, str] = {}


def _first_error(e: pydantic.ValidationError) -> str:
    err = e.errors()[0]
    field = ".".join(str(p) for p in err["loc"]) or "<root>"
    return f"plan field {field!r}: {err['msg']} (got {err.get('input')!r})"


def parse(data: Any) -> FusionPlan:
    """Validates a JSON object and returns the plan; ValueError names the bad field."""
    if isinstance(data, dict) and data.get("schema_version") not in (None, SCHEMA_VERSION):
        raise ValueError(f"plan field 'schema_version': expected {SCHEMA_VERSION}, "
                         f"got {data.get('schema_version')!r}")
    try:
        m = PlanModel.model_validate(data)
    except pydantic.ValidationError as e:
        raise ValueError(_first_error(e)) from None
    return FusionPlan(
        groups=tuple(tuple(g) for g in m.groups),
        xla_fusion=m.xla_fusion,
        buckets=None if m.buckets is None else tuple(Bucket(tuple(b.members), b.build) for b in m.buckets),
        compile_options=tuple(sorted(m.compile_options.items())),
        name=m.name,
    )
