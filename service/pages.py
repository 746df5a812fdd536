"""The HTML pages: the index (``GET /``) and a plan's report (``GET /plans/<key>``: tables and an SVG timeline).

Every page is sent with a Content-Security-Policy that allows nothing but its own inline
style (by hash) and links to the service: no script, no frame, no form, no remote content.
"""

from __future__ import annotations

import base64
import hashlib
import html
from typing import Any

from flask import Blueprint, Response, current_app, render_template_string

from disco import __version__
from service import db
from service.errors import ApiError

bp = Blueprint("pages", __name__)

SVG_WIDTH = 1000
_LANES = (("compute", "#4e79a7"), ("comm", "#f28e2b"))

_STYLE = """
 body { font: 14px/1.4 system-ui, sans-serif; margin: 2em; color: #222; max-width: 1100px; }
 table { border-collapse: collapse; margin: 1em 0; }
 th, td { border: 1px solid #ccc; padding: 4px 10px; text-align: left; }
 td.num { text-align: right; font-variant-numeric: tabular-nums; }
 tr.chosen td { font-weight: bold; background: #eef5ff; }
 code { font-size: 12px; }
"""
_STYLE_HASH = base64.b64encode(hashlib.sha256(_STYLE.encode()).digest()).decode()
CSP = (f"default-src 'none'; style-src 'sha256-{_STYLE_HASH}'; img-src 'self' data:; base-uri 'none'; "
       "form-action 'none'; frame-ancestors 'none'")

_INDEX = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>disco plan service</title>
<style>{{ style|safe }}</style></head><body>
<h1>disco plan service {{ version }}</h1>
<p>Fusion plans (op-fusion groups and gradient buckets) for data-parallel JAX training steps.
Workers ask for a plan with <code>xla_hooks.jit(step, service=URL{{ client_token }})</code>.</p>
<table>
<tr><th>POST /v1/plans</th><td>a plan for HLO text or graph JSON: cached (200) or a job (202){{ auth }}</td></tr>
<tr><th>GET /v1/jobs/&lt;id&gt;</th><td>a plan job's state and result</td></tr>
<tr><th>GET /v1/plans/&lt;key&gt;</th><td>a stored plan (JSON)</td></tr>
<tr><th>GET /plans/&lt;key&gt;</th><td>a stored plan's report (HTML, simulated timeline)</td></tr>
<tr><th>POST /v1/profiles</th><td>measured step times of plans{{ auth }}</td></tr>
<tr><th><a href="/healthz">GET /healthz</a></th><td>health: the database takes a write</td></tr>
<tr><th><a href="/openapi.json">GET /openapi.json</a></th><td>the OpenAPI document, with the request limits</td></tr>
</table>
</body></html>
"""

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>disco plan {{ key[:12] }}</title>
<style>{{ style|safe }}</style></head><body>
<h1>disco plan <code>{{ key }}</code></h1>
<p>Graph <code>{{ report.graph.name }}</code> ({{ report.graph.nodes }} nodes, {{ report.graph.all_reduces }}
all-reduces, fingerprint <code>{{ report.graph.fingerprint }}</code>) on cluster <b>{{ report.cluster.name }}</b>
({{ report.cluster.devices }} devices). Chosen by <b>{{ report.method }}</b> (strategy {{ report.strategy }}) with cost
model {{ report.cost_model.name }} v{{ report.cost_model.version }}. All times are simulated, not measured.</p>
<h2>Plan</h2>
<table>{% for k, v in summary.items() %}<tr><th>{{ k }}</th><td>{{ v }}</td></tr>{% endfor %}</table>
{% if compiled %}<h2>Compiled step time</h2>
<p>Ranked by the compiled tier: each plan compiled for the cluster's device and its module priced as built
(simulated, not measured).</p>
<table><tr><th>plan</th><th>ms</th><th>speedup vs xla_default (higher is faster)</th></tr>
{% for name, ms in compiled %}<tr{% if name == report.chosen %} class="chosen"{% endif %}><td>{{ name }}</td>
<td class="num">{{ "%.4f"|format(ms) }}</td><td class="num">{{ compiled_speedup(ms) }}</td></tr>{% endfor %}
{% for name, why in not_compiled %}<tr><td>{{ name }}</td><td colspan="2">not compiled: {{ why }}</td></tr>{% endfor %}
</table>
<h2>Emulated step time</h2>{% else %}
<h2>Simulated step time</h2>{% endif %}
<table><tr><th>plan</th><th>ms</th><th>speedup vs xla_default (higher is faster)</th></tr>
<tr class="chosen"><td>this plan ({{ report.chosen }})</td><td class="num">{{ "%.4f"|format(report.plan_ms) }}</td>
<td class="num">{{ speedup(report.plan_ms) }}</td></tr>
{% for name, ms in baselines %}<tr><td>{{ name }}</td><td class="num">{{ "%.4f"|format(ms) }}</td>
<td class="num">{{ speedup(ms) }}</td></tr>{% endfor %}
<tr><td><i>lower bound</i></td><td class="num">{{ "%.4f"|format(report.lower_bound_ms) }}</td>
<td class="num">{{ speedup(report.lower_bound_ms) }}</td></tr></table>
<h2>Simulated timeline</h2>
{{ svg|safe }}
<p><a href="/v1/plans/{{ key }}">plan JSON</a></p>
</body></html>
"""


def timeline_svg(events: list[list[Any]], width: int = SVG_WIDTH) -> str:
    """An SVG of the compute and comm streams; events narrower than a pixel are merged.

    Args:
      events: ``[name, stream, start_ms, end_ms]`` rows.
      width: drawing width in pixels.
    """
    left, right, lane_h, gap, top = 80, 45, 28, 10, 10
    end = max((e[3] for e in events), default=0.0) or 1.0
    scale = (width - left - right) / end
    height = top + len(_LANES) * (lane_h + gap) + 30
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="simulated timeline">',
             f'<rect x="0" y="0" width="{width}" height="{height}" fill="#fff"/>']
    for lane, (stream, color) in enumerate(_LANES):
        y = top + lane * (lane_h + gap)
        parts.append(f'<text x="4" y="{y + lane_h * 0.65:.1f}" font-size="13">{stream}</text>')
        parts.append(f'<rect x="{left}" y="{y}" width="{width - left - right}" height="{lane_h}" fill="#f4f4f4"/>')
        merged: list[list[Any]] = []  # [x0, x1, count, first name, busy ms]
        for name, _stream, start, stop in sorted((e for e in events if e[1] == stream), key=lambda e: e[2]):
            x0, x1 = left + start * scale, left + stop * scale
            if merged and x0 - merged[-1][1] < 1.0 and (x1 - x0 < 1.0 or merged[-1][1] - merged[-1][0] < 1.0):
                m = merged[-1]
                m[1], m[2], m[4] = max(m[1], x1), m[2] + 1, m[4] + (stop - start)
            else:
                merged.append([x0, x1, 1, name, stop - start])
        for x0, x1, count, name, busy in merged:
            label = (f"{name}: {busy:.4f} ms" if count == 1 else f"{count} events from {name}: {busy:.4f} ms busy")
            parts.append(f'<rect x="{x0:.2f}" y="{y}" width="{max(x1 - x0, 0.5):.2f}" height="{lane_h}" '
                         f'fill="{color}" stroke="#fff" stroke-width="0.2"><title>{html.escape(label)}</title></rect>')
    axis_y = top + len(_LANES) * (lane_h + gap) + 4
    parts.append(f'<line x1="{left}" y1="{axis_y}" x2="{width - right}" y2="{axis_y}" stroke="#555"/>')
    for i in range(6):
        t = end * i / 5
        x = left + t * scale
        parts.append(f'<line x1="{x:.1f}" y1="{axis_y}" x2="{x:.1f}" y2="{axis_y + 5}" stroke="#555"/>')
        parts.append(f'<text x="{x:.1f}" y="{axis_y + 18}" font-size="11" text-anchor="middle">{t:.3f} ms</text>')
    parts.append("</svg>")
    return "".join(parts)


def _speedup(base_ms: float, ms: float) -> str:
    """``base_ms / ms`` as the report prints it: the project's "speedup vs xla_default"
    (xla_default's time over the plan's; above 1 is faster, below 1 slower)."""
    return f"{base_ms / ms:.3f}x" if ms > 0 else "-"


def _html(body: str) -> Response:
    resp = Response(body, mimetype="text/html")
    resp.headers["Content-Security-Policy"] = CSP
    resp.headers["X-Content-Type-Options"] = "nosniff"
    resp.headers["Referrer-Policy"] = "no-referrer"
    return resp


@bp.get("/")
def index():
    auth = "; needs the bearer token" if current_app.config["TOKEN"] is not None else ""
    client_token = ", token=TOKEN" if auth else ""
    return _html(render_template_string(_INDEX, style=_STYLE, version=__version__, auth=auth,
                                        client_token=client_token))


@bp.get("/plans/<key>")
def plan_page(key: str):
    stored = db.get_store().get_plan(key, timeline=True) if key.isalnum() and len(key) <= 128 else None
    if stored is None:
        raise ApiError(404, "not_found", f"no plan with key {key!r}", "key")
    report = stored["report"]
    tier = report.get("tier", "emulated")
    priced = report.get("compiled") if tier == "compiled" else None
    summary = {**report.get("plan_summary", {}), "method": report.get("method"), "ranked by": f"the {tier} tier",
               f"speedup vs xla_default ({'emulated' if priced else 'simulated'})": f"{report.get('speedup_vs_xla_default', 1.0):.3f}x"}
    if priced is not None:
        summary["speedup vs xla_default (compiled)"] = f"{priced['speedup_vs_xla_default']:.3f}x"
    if report.get("tier_note"):
        summary["tier"] = report["tier_note"]
    search = report.get("search") or {}
    if "evals" in search:
        summary["search"] = (f"{search.get('strategy')}: {search['evals']} plans in {search.get('elapsed_s', 0):.1f} s")
    if "error" in search:
        summary["search"] = search["error"]
    base = report["baselines_ms"].get("xla_default") or report["plan_ms"] or 1.0
    return _html(render_template_string(_PAGE, style=_STYLE, key=key, report=report, summary=summary,
                                        speedup=lambda ms: _speedup(base, ms),
                                        compiled=[(n, priced["ms"][n]) for n in priced["ranked"]] if priced else [],
                                        not_compiled=sorted((priced or {}).get("not_compiled", {}).items()),
                                        compiled_speedup=lambda ms: _speedup(priced["ms"]["xla_default"], ms),
                                        baselines=sorted(report["baselines_ms"].items(), key=lambda kv: kv[1]),
                                        svg=timeline_svg(stored["timeline"])))
