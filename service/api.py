"""The JSON API: ``/v1/plans``, ``/v1/jobs``, ``/v1/profiles``, ``/healthz``, ``/openapi.json``."""

from __future__ import annotations

import collections
import hashlib
import hmac
import json
import queue
import re
import threading
from typing import Any

from flask import Blueprint, current_app, jsonify, request
from pydantic import TypeAdapter, ValidationError

from service import schemas
from service.app import get_store, runner
from service.errors import ApiError

bp = Blueprint("api", __name__)
_ID_RE = re.compile(r"^[0-9a-f]{8,64}$")
_VERSION = "0.1.0"


# -- helpers ---------------------------------------------------------------------------------------
def _require_token() -> None:
    token = current_app.config.get("TOKEN")
    if not token:
        return
    header = request.headers.get("Authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not given:
        raise ApiError(401, "unauthorized", "missing bearer token: send 'Authorization: Bearer <token>'",
                       None, {"WWW-Authenticate": "Bearer"})
    if not hmac.compare_digest(given.strip().encode(), str(token).encode()):
        raise ApiError(401, "unauthorized", "wrong bearer token", None, {"WWW-Authenticate": "Bearer"})


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _json_body() -> Any:
    ctype = request.mimetype or ""
    if ctype and ctype != "application/json" and not ctype.endswith("+json"):
        raise ApiError(415, "unsupported_media_type", f"expected an application/json body, got {ctype!r}")
    raw = request.get_data(cache=False)  # 413 above MAX_CONTENT_LENGTH
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
    err = e.errors(include_url=False)[0]
    field = _loc(tuple(err["loc"]))
    msg = err["msg"].removeprefix("Value error, ")
    where = f"{field}: " if field else ""
    return ApiError(400, "invalid_request", f"{where}{msg}" + (f" ({len(e.errors())} errors)"
                                                                     if len(e.errors()) > 1 else ""), field)


# Fingerprints of recently seen HLO texts, so a cached-plan request does not parse the HLO again.
_FP_CACHE: collections.OrderedDict[str, str] = collections.OrderedDict()
_FP_LOCK = threading.Lock()
_FP_CACHE_SIZE = 256


def _fingerprint(req: schemas.PlanRequest) -> str:
    from service import inputs

    if req.hlo_text is None:
        return inputs.parse_graph(None, req.graph).fingerprint
    h = hashlib.sha256(req.hlo_text.encode("utf-8", "surrogatepass")).hexdigest()
    with _FP_LOCK:
        fp = _FP_CACHE.get(h)
        if fp is not None:
            _FP_CACHE.move_to_end(h)
            return fp
    fp = inputs.parse_graph(req.hlo_text, None).fingerprint
    with _FP_LOCK:
        _FP_CACHE[h] = fp
        while len(_FP_CACHE) > _FP_CACHE_SIZE:
            _FP_CACHE.popitem(last=False)
    return fp


# -- endpoints -------------------------------------------------------------------------------------
@bp.get("/healthz")
def healthz():
    return jsonify({"status": "ok", "version": _VERSION})


@bp.get("/openapi.json")
def openapi():
    return jsonify(schemas.openapi(_VERSION, auth=bool(current_app.config.get("TOKEN"))))


@bp.post("/v1/plans")
def create_plan():
    from service import inputs, planner

    _require_token()
    body = _json_body()
    try:
        req = schemas.PlanRequest.model_validate(body)
    except ValidationError as e:
        raise _validation_error(e) from None
    if req.options.strategy not in planner.strategies():
        raise ApiError(400, "invalid_request", f"options.strategy: expected one of "
                       f"{', '.join(planner.strategies())}, got {req.options.strategy!r}", "options.strategy")
    cluster = inputs.parse_cluster(req.cluster, req.devices)
    fingerprint = _fingerprint(req)
    key = planner.plan_key(fingerprint, cluster, planner.default_costs(), req.options.model_dump())
    store = get_store()
    try:
        row, _created = store.submit(key, inputs.stored_request(req, cluster), runner().enqueue)
    except queue.Full:
        retry = int(current_app.config["RETRY_AFTER_S"])
        raise ApiError(503, "queue_full", f"the plan job queue is full ({runner().queue.maxsize} jobs); "
                       f"retry after {retry} s", None, {"Retry-After": str(retry)}) from None
    if "plan_key" in row:
        stored = store.get_plan(key)
        return jsonify({"key": key, "plan": stored["plan"], "report": stored["report"]}), 200
    return jsonify({"job_id": row["job_id"], "key": key, "state": row["state"]}), 202


@bp.get("/v1/plans/<key>")
def get_plan(key: str):
    stored = get_store().get_plan(key) if _ID_RE.match(key) else None
    if stored is None:
        raise ApiError(404, "not_found", f"no plan with key {key!r}", "key")
    return jsonify(stored)


@bp.get("/v1/jobs/<job_id>")
def get_job(job_id: str):
    store = get_store()
    job = store.get_job(job_id) if _ID_RE.match(job_id) else None
    if job is None:
        raise ApiError(404, "not_found", f"no job with id {job_id!r}", "job_id")
    job["result"] = None
    if job["state"] == "done":
        stored = store.get_plan(job["key"])
        if stored is not None:
            job["result"] = {"key": stored["key"], "plan": stored["plan"], "report": stored["report"]}
    return jsonify(job)


_SAMPLES = TypeAdapter(list[schemas.ProfileSample])


@bp.post("/v1/profiles")
def upload_profiles():
    from disco.plans.plan import FusionPlan

    _require_token()
    body = _json_body()
    if not isinstance(body, list) or not body:
        raise ApiError(400, "invalid_request", "expected a non-empty JSON list of profile samples, got "
                       f"{type(body).__name__ if body != [] else 'an empty list'}")
    if len(body) > schemas.MAX_PROFILES:
        raise ApiError(400, "invalid_request", f"at most {schemas.MAX_PROFILES} samples per upload, got {len(body)}")
    try:
        samples = _SAMPLES.validate_python(body)
    except ValidationError as e:
        raise _validation_error(e) from None
    rows = []
    for i, s in enumerate(samples):
        try:
            plan = FusionPlan.from_dict(s.plan)
        except (ValueError, TypeError) as e:
            raise ApiError(400, "invalid_plan", f"[{i}].plan: {e}", f"[{i}].plan") from None
        rows.append({**s.model_dump(), "plan": plan.to_dict(), "plan_digest": plan.digest()})
    return jsonify({"stored": get_store().add_profiles(rows)}), 201
