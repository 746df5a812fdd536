"""The JSON API: ``/v1/plans``, ``/v1/jobs``, ``/v1/profiles``, ``/v1/trials``, ``/healthz``, ``/openapi.json``.

A plan's key is made of what the server computed, never of what the client claims:
the program's identity (:mod:`service.programs`), the cluster, the cost model and the
options; and the environment the client names (jax, backend, topology, XLA flags), which
the report of its plan echoes. Every request is validated here, before a job exists (400 naming the field).

A job that measures plans (``xla_hooks.jit(..., trials=n)``) asks for ``candidates``: the plan and
the next best baselines, predicted best first; it reports what it measured to ``/v1/trials``,
stored under the key it was answered. From then on a request of that key is answered the
measured winner, with ``measured`` saying so (and the job runs no trials).
"""

from __future__ import annotations

import hmac
import json
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from flask import Blueprint, current_app, jsonify, request
from pydantic import TypeAdapter, ValidationError
from werkzeug.exceptions import RequestEntityTooLarge

from disco import __version__
from service import db, inputs, jobs, limits, schemas
from service.errors import ApiError
from service.intake import Intake, Program, graph_program

if TYPE_CHECKING:
    from disco.plans.plan import FusionPlan

T = TypeVar("T")
bp = Blueprint("api", __name__)
_ID_RE = re.compile(r"^[0-9a-f]{8,64}$")


# -- helpers ---------------------------------------------------------------------------------------
def _require_token() -> None:
    token = current_app.config["TOKEN"]
    if token is None:  # create_app refuses an empty token and logs that anyone can write
        return
    header = request.headers.get("Authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not given:
        raise ApiError(401, "unauthorized", "missing bearer token: send 'Authorization: Bearer <token>'",
                       None, {"WWW-Authenticate": "Bearer"})
    # both sides stripped: a token read from a file or an environment variable may end in a newline
    if not hmac.compare_digest(given.strip().encode(), str(token).strip().encode()):
        raise ApiError(401, "unauthorized", "wrong bearer token", None, {"WWW-Authenticate": "Bearer"})


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _body_bytes() -> bytes:
    """The request body; 413 above MAX_CONTENT_LENGTH, from Content-Length or, chunked, while reading."""
    limit = int(current_app.config["MAX_CONTENT_LENGTH"])
    if request.content_length is not None:
        return request.get_data(cache=False)  # Werkzeug answers 413 from the header
    stream = request.environ["wsgi.input"]
    if not request.environ.get("wsgi.input_terminated"):
        return b""  # no length and a server that does not end the stream: nothing is safe to read
    parts, size = [], 0
    while size <= limit:
        part = stream.read(min(1 << 20, limit + 1 - size))
        if not part:
            return b"".join(parts)
        parts.append(part)
        size += len(part)
    raise RequestEntityTooLarge()


def _json_body() -> Any:
    ctype = request.mimetype or ""
    if ctype and ctype != "application/json" and not ctype.endswith("+json"):
        raise ApiError(415, "unsupported_media_type", f"expected an application/json body, got {ctype!r}")
    raw = _body_bytes()
    if not raw:
        raise ApiError(400, "invalid_json", "request body is empty; expected a JSON document")
    try:
        return json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ApiError(400, "invalid_json", f"request body is not valid JSON: {e}") from None


def _loc(loc: tuple[Any, ...]) -> str | None:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("str", "ClusterYaml", "dict[str,any]") or "[" in str(part):
            continue  # union member tags
        else:
            out += ("." if out else "") + str(part)
    return out or None


def _validation_error(e: ValidationError) -> ApiError:
    errs = e.errors(include_url=False, include_input=False)
    field = _loc(tuple(errs[0]["loc"]))
    msg = errs[0]["msg"].removeprefix("Value error, ")
    where = f"{field}: " if field else ""
    return ApiError(400, "invalid_request", f"{where}{msg}" + (f" ({len(errs)} errors)" if len(errs) > 1 else ""),
                    field)


def _posted(validate: Callable[[Any], T]) -> T:
    """The write endpoints' preamble: the bearer token checked, the JSON body read and validated by
    ``validate`` (a pydantic model's ``model_validate`` or a ``TypeAdapter``'s ``validate_python``);
    400 naming the first invalid field."""
    _require_token()
    body = _json_body()
    try:
        return validate(body)
    except ValidationError as e:
        raise _validation_error(e) from None


def _plan_at(plan: Any, where: str) -> FusionPlan:
    """A posted plan (``where`` names it in the error: ``trials[2].plan``), or 400 ``invalid_plan``."""
    from disco.plans.plan import FusionPlan

    try:
        return FusionPlan.from_dict(plan)
    except (ValueError, TypeError) as e:
        raise ApiError(400, "invalid_plan", f"{where}: {e}", where) from None


def _program(req: schemas.PlanRequest) -> Program:
    """The posted program as the server identifies it (HLO checked in a child process)."""
    if req.hlo_text is not None:
        intake: Intake = current_app.extensions["disco_intake"]
        return intake.hlo(req.hlo_text)
    assert req.graph is not None
    _graph, program = graph_program(inputs.graph_from_json(req.graph))
    return program


def _answer(key: str, stored: dict[str, Any], candidates: int, measured: dict[str, Any] | None) -> dict[str, Any]:
    """The answer to a plan request: the stored plan and report (its candidates moved out of it), the
    first ``candidates`` candidates when more than one is asked for; or the measured winner."""
    report = dict(stored["report"])
    stored_candidates = report.pop("candidates", None) or [
        {"name": stored["plan"].get("name") or "plan", "predicted_ms": report.get("plan_ms"), "plan": stored["plan"]}]
    out: dict[str, Any] = {"key": key, "plan": stored["plan"], "report": report}
    if measured is not None:
        summary = {k: measured[k] for k in ("run_id", "name", "step_time_ms", "processes", "trials")}
        out.update(plan=measured["plan"], report={**report, "measured": summary}, measured=summary)
        if candidates > 1:
            out["candidates"] = [{"name": measured["name"], "measured_ms": measured["step_time_ms"],
                                  "plan": measured["plan"]}]
    elif candidates > 1:
        out["candidates"] = stored_candidates[:candidates]
    return out


# -- endpoints -------------------------------------------------------------------------------------
@bp.get("/healthz")
def healthz():
    problem = db.health()
    if problem is not None:
        raise ApiError(503, "database_unavailable", problem, None,
                       {"Retry-After": str(current_app.config["RETRY_AFTER_S"])})
    return jsonify({"status": "ok", "version": __version__, "database": "ok"})


@bp.get("/openapi.json")
def openapi():
    return jsonify(schemas.openapi(__version__, auth=bool(current_app.config.get("TOKEN"))))


@bp.post("/v1/plans")
def create_plan():
    from disco import planner

    req = _posted(schemas.PlanRequest.model_validate)
    if req.options.strategy not in planner.strategies():
        raise ApiError(400, "invalid_request", f"options.strategy: expected one of "
                       f"{', '.join(planner.strategies())}, got {req.options.strategy!r}", "options.strategy")
    cluster = inputs.parse_cluster(req.cluster, req.devices)
    program = _program(req)
    environment = None if req.environment is None else req.environment.model_dump()
    options = inputs.planner_options(req, cluster)
    key = planner.plan_key(program.identity, cluster, planner.default_costs(cluster.device), options, environment)
    store = db.get_store()
    measured = store.measured(key)
    if measured is not None:
        stored = store.get_plan(key)
        if stored is not None:
            return jsonify(_answer(key, stored, req.candidates, measured)), 200
    row, created = store.submit(key, inputs.stored_request(req, cluster, program.fingerprint, options))
    if created:
        limit = int(current_app.config["QUEUE_SIZE"])
        if store.backlog() > limit:  # this job counted: more than QUEUE_SIZE wait for a worker
            retry = int(current_app.config["RETRY_AFTER_S"])
            message = f"the plan job queue is full ({limit} jobs); retry after {retry} s"
            store.fail_job(row["job_id"], "queue_full", message)
            raise ApiError(503, "queue_full", message, None, {"Retry-After": str(retry)})
        jobs.get_runner().notify()
    if "plan_key" in row:
        stored = store.get_plan(key)
        return jsonify(_answer(key, stored, req.candidates, None)), 200
    return jsonify({"job_id": row["job_id"], "key": key, "state": row["state"]}), 202


@bp.get("/v1/plans/<key>")
def get_plan(key: str):
    stored = db.get_store().get_plan(key) if _ID_RE.match(key) else None
    if stored is None:
        raise ApiError(404, "not_found", f"no plan with key {key!r}", "key")
    return jsonify(stored)


def _candidates_arg() -> int:
    """The ``candidates`` query parameter (default 1): 400 for anything but an integer in [1, MAX_CANDIDATES]."""
    raw = request.args.get("candidates", "1")
    if not raw.isdigit() or not 1 <= int(raw) <= limits.MAX_CANDIDATES:
        raise ApiError(400, "invalid_request", f"candidates: expected an integer in [1, {limits.MAX_CANDIDATES}], "
                       f"got {raw[:40]!r}", "candidates")
    return int(raw)


@bp.get("/v1/jobs/<job_id>")
def get_job(job_id: str):
    store = db.get_store()
    job = store.get_job(job_id) if _ID_RE.match(job_id) else None
    if job is None:
        raise ApiError(404, "not_found", f"no job with id {job_id!r}", "job_id")
    job["result"] = None
    if job["state"] == "done":
        stored = store.get_plan(job["key"])
        if stored is not None:  # ?candidates=n: as POST /v1/plans answers a request with candidates n
            job["result"] = _answer(stored["key"], stored, _candidates_arg(), store.measured(stored["key"]))
    return jsonify(job)


_SAMPLES = TypeAdapter(list[schemas.ProfileSample])


def _profile_samples(body: Any) -> list[schemas.ProfileSample]:
    """``POST /v1/profiles``'s body: a non-empty list of at most MAX_PROFILES samples."""
    if not isinstance(body, list) or not body:
        raise ApiError(400, "invalid_request", "expected a non-empty JSON list of profile samples, got "
                       f"{type(body).__name__ if body != [] else 'an empty list'}")
    if len(body) > schemas.MAX_PROFILES:
        raise ApiError(400, "invalid_request", f"at most {schemas.MAX_PROFILES} samples per upload, got {len(body)}")
    return _SAMPLES.validate_python(body)


@bp.post("/v1/profiles")
def upload_profiles():
    samples = _posted(_profile_samples)
    rows = []
    for i, s in enumerate(samples):
        plan = _plan_at(s.plan, f"[{i}].plan")
        rows.append({**s.model_dump(), "plan": plan.to_dict(), "plan_digest": plan.digest()})
    return jsonify({"stored": db.get_store().add_profiles(rows)}), 201


@bp.post("/v1/trials")
def report_trials():
    """Stores the step times a job measured for the candidates of a plan key (one run)."""
    from service.trials import median_ms

    req = _posted(schemas.TrialReport.model_validate)
    store = db.get_store()
    stored = store.get_plan(req.key)
    if stored is None:
        raise ApiError(404, "not_found", f"no plan with key {req.key!r}: trials are stored under a key this "
                       "service answered", "key")
    rows = []
    for i, t in enumerate(req.trials):
        plan = _plan_at(t.plan, f"trials[{i}].plan")
        rows.append({"plan": plan.to_dict(), "plan_digest": plan.digest(), "name": t.name,
                     "predicted_ms": t.predicted_ms, "samples_ms": t.samples_ms,
                     "step_time_ms": median_ms(t.samples_ms)})  # each step on its slowest process
    n = store.add_trials(req.key, req.run_id, stored["fingerprint"], stored["report"].get("environment"), rows,
                         req.winner)
    won = rows[req.winner]
    return jsonify({"key": req.key, "stored": n, "winner": {"name": won["name"], "plan_digest": won["plan_digest"],
                                                            "step_time_ms": won["step_time_ms"]}}), 201
