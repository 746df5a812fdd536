"""Every 4xx/5xx the service sends is JSON ``{code, message, field}``.

A database that cannot be used (read-only, damaged, gone) is answered 503
``database_unavailable`` with the database's reason; anything unexpected is 500 ``internal``
(the details go to the log, not to the client).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from service import store

log = logging.getLogger(__name__)


class ApiError(Exception):
    """An error answered as JSON.

    Args:
      status: the HTTP status.
      code: a short machine-readable code, e.g. "invalid_hlo".
      message: what was received and what was expected.
      field: the request field at fault, or None.
      headers: extra response headers (e.g. Retry-After).
    """

    def __init__(self, status: int, code: str, message: str, field: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.headers = headers or {}


def _body(code: str, message: str, field: str | None) -> dict[str, Any]:
    return {"code": code, "message": message, "field": field}


def json_body(code: str, message: str, field: str | None = None) -> bytes:
    """An error body as bytes, for answers sent outside Flask (the development server's 414)."""
    return json.dumps(_body(code, message, field)).encode()


def is_unavailable(e: BaseException) -> bool:
    """Whether a database error means the database cannot be used (not a bug in a query)."""
    return store.is_unavailable(e)


def _snake(name: str) -> str:
    return name.lower().replace(" ", "_").replace("'", "")


def register(app: Any) -> None:
    """Installs the JSON error handlers on ``app``."""
    from flask import jsonify
    from werkzeug.exceptions import HTTPException

    @app.errorhandler(ApiError)
    def _api_error(e: ApiError):
        resp = jsonify(_body(e.code, e.message, e.field))
        resp.status_code = e.status
        resp.headers.update(e.headers)
        return resp

    @app.errorhandler(HTTPException)
    def _http_error(e: HTTPException):
        message = e.description or e.name
        if e.code == 413:
            limit = app.config.get("MAX_CONTENT_LENGTH")
            message = f"request body is larger than the limit of {limit} bytes"
        resp = jsonify(_body(_snake(e.name), message, None))
        resp.status_code = e.code or 500
        if e.code == 405 and getattr(e, "valid_methods", None):
            resp.headers["Allow"] = ", ".join(e.valid_methods)
        return resp

    @app.errorhandler(Exception)
    def _unexpected(e: Exception):
        if is_unavailable(e):
            log.error("database unavailable: %s", e)
            resp = jsonify(_body("database_unavailable", f"the database cannot be used: {e}", None))
            resp.status_code = 503
            resp.headers["Retry-After"] = str(app.config.get("RETRY_AFTER_S", 5))
            return resp
        log.exception("unhandled error")
        resp = jsonify(_body("internal", f"internal error: {type(e).__name__}", None))
        resp.status_code = 500
        return resp
