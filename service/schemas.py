"""The REST API's boundary models (pydantic, strict) and the OpenAPI 3 document built from them.

Requests are validated here and nowhere else; inside the service plain dicts and
disco's dataclasses are used. Strict mode: a string is not a number, a float is
not an integer, unknown fields are rejected.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from disco.ir.graph import SCHEMA as GRAPH_SCHEMA
from service import limits

MAX_PROFILES = limits.MAX_PROFILES
_NAME = r"^[A-Za-z0-9_.:\-]+$"
_TEXT = limits.MAX_TEXT
_VERSION = r"^[A-Za-z0-9_.+\-]+$"  # PEP 440 with a local part (0.10.2.dev1+cuda)


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class ClusterYaml(_Strict):
    """A cluster in disco's YAML format (see ``disco.sim.cluster``)."""

    yaml: str = Field(min_length=1, max_length=limits.MAX_CLUSTER_YAML, description="cluster YAML text")


class PlanOptions(_Strict):
    """What the planner may spend and how it searches."""

    budget_s: float = Field(10.0, gt=0, le=3600, allow_inf_nan=False, description="search time budget, seconds")
    strategy: str = Field("auto", min_length=1, max_length=64, pattern=r"^[a-z0-9_\-]+$",
                          description="auto | baselines | random | a strategy of disco.search")
    seed: int = Field(0, ge=0, le=2**31 - 1)
    max_evals: int | None = Field(None, ge=1, le=10_000_000,
                                  description="also stop after this many plan evaluations; with a budget_s the "
                                              "search does not reach, the same request always gives the same plan")
    tier: Literal["auto", "emulated", "compiled"] = Field(
        "auto", description="which tier of the simulator ranks the answer: emulated (XLA's fusion emulated, "
                            "the search's own), compiled (the answer, xla_default and the baselines compiled for "
                            "the cluster's device, deviceless XLA:GPU for a GPU cluster, and priced as built; needs "
                            "hlo_text, a GPU cluster and `make install-gpu` on the server), or auto: compiled where "
                            "it can run, else emulated")


class Environment(_Strict):
    """The job's side of the plan key (``xla_hooks.environment.CompileEnvironment``): a plan is
    answered only to a request naming the same environment."""

    jax: str = Field(min_length=1, max_length=64, pattern=_VERSION, description="jax version")
    jaxlib: str = Field(min_length=1, max_length=64, pattern=_VERSION, description="jaxlib version")
    platform: str = Field(min_length=1, max_length=64, description="backend platform (cpu, gpu, tpu)")
    device_kind: str = Field(min_length=1, max_length=256, description="jax.devices()[0].device_kind")
    processes: int = Field(ge=1, le=limits.MAX_CLUSTER_DEVICES, description="jax.process_count()")
    devices_per_process: int = Field(ge=1, le=limits.MAX_CLUSTER_DEVICES, description="jax.local_device_count()")
    xla_flags: list[Annotated[str, Field(max_length=1024)]] = Field(
        default_factory=list, max_length=256, description="XLA_FLAGS, sorted, without dump and log flags")


class GraphNode(_Strict):
    """One instruction of a graph JSON (``disco.ir.graph.Node``)."""

    name: str = Field(min_length=1, max_length=_TEXT)
    opcode: str = Field(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9\-_]*$")
    computation: str = Field(max_length=_TEXT)
    shape: str = Field(max_length=_TEXT)
    dtype: str = Field(max_length=64)
    out_bytes: int = Field(ge=0, le=limits.MAX_BYTES)
    out_elements: int = Field(ge=0, le=limits.MAX_ELEMENTS)
    flops: float = Field(ge=0, le=limits.MAX_FLOPS, allow_inf_nan=False)
    operands: list[str] = Field(default_factory=list, max_length=limits.MAX_OPERANDS)
    grad_bytes: int = Field(0, ge=0, le=limits.MAX_BYTES)
    param_path: str | None = Field(None, max_length=_TEXT)
    replica_groups: str | None = Field(None, max_length=_TEXT)
    reduction: str | None = Field(None, max_length=64)
    layout: str = Field("", max_length=_TEXT)


class GraphJson(_Strict):
    """A disco graph (``HloGraph.to_dict()``); nodes in a topological order.

    ``fingerprint`` is accepted and ignored: the service identifies the graph by its own
    digest of the nodes and edges.
    """

    schema_: Literal[GRAPH_SCHEMA] = Field(alias="schema")  # type: ignore[valid-type]
    name: str = Field(min_length=1, max_length=_TEXT)
    fingerprint: str | None = Field(None, max_length=128, description="ignored; the service computes its own")
    nodes: list[GraphNode] = Field(min_length=1, max_length=limits.MAX_GRAPH_NODES)
    edges: list[Annotated[list[int], Field(min_length=2, max_length=2)]] = Field(
        max_length=limits.MAX_GRAPH_EDGES, description="[producer, consumer] node indices, producer < consumer")
    mesh: list[Annotated[list[str | int], Field(min_length=2, max_length=2)]] | None = Field(
        None, max_length=16, description="the sdy mesh's [axis, size] pairs, in mesh order (HloGraph.mesh); "
                                         "absent for a step without one")

    @model_validator(mode="after")
    def _consistent(self) -> GraphJson:
        for i, pair in enumerate(self.mesh or ()):
            name, size = pair
            if not (isinstance(name, str) and 0 < len(name) <= 64) or isinstance(size, bool) or not (
                    isinstance(size, int) and size >= 1):
                raise ValueError(f"mesh[{i}]: expected [axis name, size >= 1], got {pair!r}")
        seen: set[str] = set()
        for i, n in enumerate(self.nodes):
            for op in n.operands:
                if op not in seen:
                    raise ValueError(f"nodes[{i}].operands: {op[:80]!r} is not the name of an earlier node")
            if n.name in seen:
                raise ValueError(f"nodes[{i}].name: {n.name[:80]!r} appears twice")
            seen.add(n.name)
        count = len(self.nodes)
        for i, (src, dst) in enumerate(self.edges):
            if not 0 <= src < dst < count:
                raise ValueError(f"edges[{i}]: expected [producer, consumer] with 0 <= producer < consumer < "
                                 f"{count} (nodes in a topological order), got [{src}, {dst}]")
        return self


class PlanRequest(_Strict):
    """``POST /v1/plans``: one of ``hlo_text`` and ``graph``, the cluster, options."""

    hlo_text: str | None = Field(None, min_length=1, max_length=limits.MAX_HLO_CHARS,
                                 description="pre-optimisation HLO module text")
    graph: GraphJson | None = Field(None, description="disco graph JSON (HloGraph.to_dict)")
    cluster: str | ClusterYaml = Field("local", description="a preset name or {yaml: ...}")
    devices: int | None = Field(None, ge=1, le=limits.MAX_CLUSTER_DEVICES, description="devices for the 'local' preset")
    options: PlanOptions = Field(default_factory=PlanOptions)
    environment: Environment | None = Field(None, description="the job's jax, backend, topology and XLA flags; "
                                                              "part of the plan key, echoed in the report")
    candidates: int = Field(1, ge=1, le=limits.MAX_CANDIDATES,
                            description="how many plans to answer, predicted best first, for the job to measure "
                                        "(xla_hooks.jit trials); not part of the plan key")

    @model_validator(mode="after")
    def _one_graph(self) -> PlanRequest:
        if (self.hlo_text is None) == (self.graph is None):
            raise ValueError("give exactly one of 'hlo_text' and 'graph'")
        return self


class ProfileSample(_Strict):
    """One measured step time of a plan on a graph."""

    fingerprint: str = Field(min_length=1, max_length=128, pattern=_NAME, description="HloGraph.fingerprint")
    plan: dict[str, Any] = Field(description="the FusionPlan JSON that was measured")
    step_time_ms: float = Field(gt=0, le=1e9, allow_inf_nan=False, description="measured step time, ms")
    cluster: str | None = Field(None, max_length=256)
    device_kind: str | None = Field(None, max_length=256)
    extra: dict[str, Any] | None = Field(None, description="free-form measurement metadata")


class Trial(_Strict):
    """One candidate plan a job measured: its step times on every process."""

    plan: dict[str, Any] = Field(description="the FusionPlan JSON that was measured")
    name: str = Field(min_length=1, max_length=256, description="the candidate's name (its plan's, or a baseline's)")
    predicted_ms: float | None = Field(None, ge=0, le=1e9, allow_inf_nan=False,
                                       description="the step time the planner predicted, ms")
    samples_ms: list[Annotated[list[Annotated[float, Field(gt=0, le=1e9, allow_inf_nan=False)]],
                               Field(min_length=1, max_length=limits.MAX_TRIAL_SAMPLES)]] = Field(
        min_length=1, max_length=limits.MAX_CLUSTER_DEVICES,
        description="per process, the measured time of each timed step, ms")

    @model_validator(mode="after")
    def _same_steps(self) -> Trial:
        steps = {len(s) for s in self.samples_ms}
        if len(steps) != 1:
            raise ValueError(f"samples_ms: expected the same number of steps on every process, got {sorted(steps)}")
        if len(self.samples_ms) * len(self.samples_ms[0]) > limits.MAX_TRIAL_SAMPLES:
            raise ValueError(f"samples_ms: at most {limits.MAX_TRIAL_SAMPLES} step times per trial")
        return self


class TrialReport(_Strict):
    """``POST /v1/trials``: what a job measured for the candidates of one plan key, and which it kept."""

    key: str = Field(min_length=8, max_length=64, pattern=r"^[0-9a-f]+$", description="the plan key answered")
    run_id: str = Field(min_length=1, max_length=64, pattern=_NAME, description="one id per job and program")
    trials: list[Trial] = Field(min_length=1, max_length=limits.MAX_CANDIDATES + 1)
    winner: int = Field(ge=0, description="the index in trials of the plan the job kept")

    @model_validator(mode="after")
    def _one_run(self) -> TrialReport:
        if self.winner >= len(self.trials):
            raise ValueError(f"winner: expected an index into the {len(self.trials)} trials, got {self.winner}")
        processes = {len(t.samples_ms) for t in self.trials}
        if len(processes) != 1:
            raise ValueError(f"trials: expected samples of the same processes in every trial, got "
                             f"{sorted(processes)} processes")
        return self


class Error(BaseModel):
    """Every 4xx/5xx body."""

    code: str
    message: str
    field: str | None = None


class PlanResult(BaseModel):
    key: str
    plan: dict[str, Any]
    report: dict[str, Any]
    candidates: list[dict[str, Any]] | None = Field(
        None, description="with candidates > 1 in the request: [{name, predicted_ms, plan}], predicted best first "
                          "(the measured winner alone when measured)")
    measured: dict[str, Any] | None = Field(
        None, description="the plan is the winner a job measured for this key: {run_id, step_time_ms, trials}")


class StoredPlan(PlanResult):
    fingerprint: str
    created_at: float


class JobAccepted(BaseModel):
    job_id: str
    key: str
    state: Literal["queued", "running", "done", "failed"]


class Job(BaseModel):
    job_id: str
    key: str
    state: Literal["queued", "running", "done", "failed"]
    progress: float
    message: str
    attempts: int
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    result: PlanResult | None = None
    error: Error | None = None


class ProfilesStored(BaseModel):
    stored: int


class TrialsStored(BaseModel):
    key: str
    stored: int
    winner: dict[str, Any]


class Health(BaseModel):
    status: Literal["ok"]
    version: str
    database: Literal["ok"]


# -- OpenAPI ---------------------------------------------------------------------------------------
def _json(schema: str, description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}}}


def _errors(*codes: int) -> dict[str, Any]:
    what = {400: "invalid input", 401: "missing or wrong bearer token", 404: "not found",
            413: "body too large", 415: "body is not JSON",
            503: "job queue full or HLO checks busy (see Retry-After), or the database is unavailable"}
    return {str(c): _json("Error", what[c]) for c in codes}


def openapi(version: str, auth: bool) -> dict[str, Any]:
    """The OpenAPI 3.1 document of the service."""
    models = [ClusterYaml, PlanOptions, Environment, GraphNode, GraphJson, PlanRequest, ProfileSample, Trial, TrialReport, Error, PlanResult, StoredPlan,
              JobAccepted, Job, ProfilesStored, TrialsStored, Health]
    schemas: dict[str, Any] = {}
    for m in models:
        s = m.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(s.pop("$defs", {}))
        schemas[m.__name__] = s
    schemas["ProfileSamples"] = {"type": "array", "items": {"$ref": "#/components/schemas/ProfileSample"},
                                 "minItems": 1, "maxItems": MAX_PROFILES}
    secured = [{"bearer": []}] if auth else []
    key_param = {"name": "key", "in": "path", "required": True, "schema": {"type": "string", "maxLength": 128}}
    paths = {
        "/v1/plans": {"post": {
            "summary": "Get a plan: cached (200) or from a background job (202)",
            "operationId": "createPlan", "security": secured,
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/PlanRequest"}}}},
            "responses": {"200": _json("PlanResult", "cached plan"),
                          "202": _json("JobAccepted", "a job computes the plan (joined if one is running)"),
                          **_errors(400, 401, 413, 415, 503)}}},
        "/v1/plans/{key}": {"get": {
            "summary": "A stored plan", "operationId": "getPlan", "parameters": [key_param],
            "responses": {"200": _json("StoredPlan", "the plan"), **_errors(404)}}},
        "/v1/jobs/{job_id}": {"get": {
            "summary": "A plan job's state", "operationId": "getJob",
            "parameters": [{"name": "job_id", "in": "path", "required": True,
                            "schema": {"type": "string", "maxLength": 128}},
                           {"name": "candidates", "in": "query", "required": False,
                            "description": "answer the result's candidates as POST /v1/plans does for this many",
                            "schema": {"type": "integer", "minimum": 1, "maximum": limits.MAX_CANDIDATES}}],
            "responses": {"200": _json("Job", "the job"), **_errors(400, 404)}}},
        "/v1/profiles": {"post": {
            "summary": "Upload measured step times", "operationId": "uploadProfiles", "security": secured,
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/ProfileSamples"}}}},
            "responses": {"201": _json("ProfilesStored", "stored"), **_errors(400, 401, 413, 415)}}},
        "/v1/trials": {"post": {
            "summary": "Report the step times a job measured for a key's candidate plans; the next "
                       "request of that key gets the measured winner",
            "operationId": "reportTrials", "security": secured,
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/TrialReport"}}}},
            "responses": {"201": _json("TrialsStored", "stored"), **_errors(400, 401, 404, 413, 415)}}},
        "/plans/{key}": {"get": {
            "summary": "HTML report of a plan with its simulated timeline", "operationId": "planPage",
            "parameters": [key_param],
            "responses": {"200": {"description": "HTML page", "content": {"text/html": {"schema": {"type": "string"}}}},
                          **_errors(404)}}},
        "/healthz": {"get": {"summary": "Health: the database answers a write and its quick_check",
                             "operationId": "healthz",
                             "responses": {"200": _json("Health", "healthy"), **_errors(503)}}},
        "/openapi.json": {"get": {"summary": "This document", "operationId": "openapi",
                                  "responses": {"200": {"description": "OpenAPI document",
                                                        "content": {"application/json": {"schema": {"type": "object"}}}}}}},
    }
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "disco plan service", "version": version,
                 "description": "Fusion plans (op-fusion groups and gradient buckets) for data-parallel JAX steps.",
                 "x-limits": limits.describe()},
        "paths": paths,
        "components": {"schemas": schemas},
    }
    if auth:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    return doc
