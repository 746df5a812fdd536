"""``xla_hooks.jit``: a ``jax.jit`` that asks disco (a plan service, or the local planner) for a plan.

On the first call for each argument signature (shapes, dtypes, shardings, tree
structure) the step is lowered, its pre-optimisation HLO sent to the plan service
(``POST /v1/plans``; a 202 job is polled until done), the returned plan checked
against the step's graph and applied with :func:`xla_hooks.apply`. The compiled
step is cached per signature. With ``service=None`` the plan comes from
:func:`disco.planner.plan_for_graph` in this process.

Training never stops because of disco: if the service is unreachable, slower than
``timeout_s``, answers an error or something that is not a plan for this step (or for
this job's jax, backend, topology and XLA flags: :mod:`xla_hooks.environment`), a
:class:`PlanServiceWarning` (a :class:`PlanFallbackWarning`) says why and the step
is compiled by XLA's defaults.

In a multi-process job only process 0 asks; every process applies the plan it publishes, or all
use XLA's default together (:mod:`xla_hooks.agreement`, :class:`PlanAgreementWarning`).

With ``trials=n`` the job measures: the service answers its ``n`` best candidates, every
process compiles each (and XLA's default) ahead, the first steps run on them in turn, the
fastest is kept and the step times go back to the service (:mod:`xla_hooks.trials`); a key
the service has measured before is answered its measured winner, and no trials run.

Example::

  step = xla_hooks.jit(train_step, service="http://127.0.0.1:8000", cluster="local",
                       token=os.environ["DISCO_SERVICE_TOKEN"])  # the server's --token
  state, loss = step(state, batch)      # plans and compiles on the first call
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from disco.ir.arguments import devices_of
from xla_hooks.agreement import DEFAULT_AGREE_TIMEOUT_S
from xla_hooks.apply_plan import PlanFallbackWarning
from xla_hooks.service_client import NoPlan, ServiceClient, check_service_url, checked_token
from xla_hooks.trials import DEFAULT_TRIAL_STEPS, Candidate, TrialReportWarning, TrialRun


class PlanServiceWarning(PlanFallbackWarning):
    """No plan could be obtained from the plan service (or the local planner); XLA's default is used."""


class PlanAgreementWarning(PlanFallbackWarning):
    """In a multi-process job, the plan did not reach or did not apply on every process (or a wait for
    another process timed out): every process uses XLA's default."""


@dataclasses.dataclass(frozen=True)
class _Answer:
    """What process 0 obtained: the plan (None: none, ``reason`` why), its report, the service's
    key (None from the local planner) and, with trials, the candidates to measure (the plan first)."""

    plan: Any
    report: dict[str, Any] | None
    reason: str | None = None
    key: str | None = None
    candidates: tuple[Candidate, ...] = ()


def _signature(inputs: Any) -> Any:
    """What one compiled step serves: the inputs' (positional and keyword arguments') tree
    structure and each leaf's shape, dtype, weak type and sharding."""
    import jax

    leaves, treedef = jax.tree.flatten(inputs)
    sig = []
    for x in leaves:
        shape = getattr(x, "shape", None)
        dtype = getattr(x, "dtype", None)
        sharding = getattr(x, "sharding", None)
        if shape is None:  # a Python scalar: traced as a weak-typed scalar, so its type matters, not its value
            sig.append(("py", type(x).__name__))
        elif sharding is None:
            sig.append((tuple(shape), str(dtype), None))
        else:  # equivalent shardings (e.g. P() and P(None,)) must share one compiled step
            # jax traces a weak-typed array (a jitted function's Python-number result) as it does a
            # Python scalar: its dtype yields to the other operand's, so it is its own signature
            sig.append((tuple(shape), str(dtype), bool(getattr(x, "weak_type", False)),
                        _placement(sharding, tuple(shape))))
    return treedef, tuple(sig)


def _placement(sharding: Any, shape: tuple[int, ...]) -> Any:
    """Which slice of an array of ``shape`` each device holds under ``sharding``, and its memory kind:
    equal for equivalent shardings (P() and P(None,)), different wherever a compiled step's input
    sharding would not match (P("a", "b") and P("b", "a") place equal shard shapes on other devices)."""
    try:
        return _placement_cached(sharding, shape)
    except TypeError:  # a sharding that does not hash
        return _placement_cached.__wrapped__(sharding, shape)


@functools.lru_cache(maxsize=4096)
def _placement_cached(sharding: Any, shape: tuple[int, ...]) -> Any:
    placed = sorted((d.id, tuple((s.start, s.stop, s.step) if isinstance(s, slice) else s for s in index))
                    for d, index in sharding.devices_indices_map(shape).items())
    return tuple(placed), getattr(sharding, "memory_kind", None)


class _BySignature(dict):
    """A dict keyed by argument signatures (each the inputs' whole tree structure) that prints as
    one short line: how many signatures, and the first value."""

    def __repr__(self) -> str:
        first = "" if not self else f": {next(iter(self.values()))!r}"[:150]
        return f"{{{len(self)} signature{'' if len(self) == 1 else 's'}{first}{', ...' if len(self) > 1 else ''}}}"


def _spans_processes(inputs: Any) -> bool:
    """Whether a step over ``inputs`` runs on devices of other processes too (an input sharded or
    replicated over them): only such a step's compiles must agree across processes; one over this
    process's devices alone may be compiled by this process only (an evaluation on process 0)."""
    import jax

    return any(not getattr(getattr(x, "sharding", None), "is_fully_addressable", True)
               for x in jax.tree.leaves(inputs))


class PlannedStep:
    """The callable ``xla_hooks.jit`` returns; compiled steps are cached per argument signature.

    Attributes:
      applied: the :class:`xla_hooks.AppliedStep` of each signature compiled so far (in a
        multi-process job, the same plan on every process: :mod:`xla_hooks.agreement`).
      reports: the planner's report for each signature (None after a fallback); after trials it
        holds them under ``"trials"``, and an answer the service measured says so under ``"measured"``.
      trials: per signature whose trials ended, each candidate's name, predicted and measured ms
        and whether it won (:func:`xla_hooks.trials.summary`).
    """

    def __init__(self, step_fn: Callable[..., Any], *, service: str | None, cluster: Any,
                 timeout_s: float, token: str | None, options: Mapping[str, Any] | None,
                 agree_timeout_s: float = DEFAULT_AGREE_TIMEOUT_S, trials: int = 0,
                 trial_steps: int = DEFAULT_TRIAL_STEPS):
        from disco.ir.step_form import read

        self.step_fn = step_fn
        self.form = read(step_fn)
        self.service = service.rstrip("/") if service else None
        self.cluster = cluster
        self.timeout_s = float(timeout_s)
        self.agree_timeout_s = float(agree_timeout_s)
        self.token = token
        self.options = dict(options or {})
        self.trial_count = int(trials)
        self.trial_steps = int(trial_steps)
        self.applied: dict[Any, Any] = _BySignature()
        self.reports: dict[Any, dict[str, Any] | None] = _BySignature()
        self.trials: dict[Any, list[dict[str, Any]]] = _BySignature()
        self._running: dict[Any, TrialRun] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        name = getattr(self.step_fn, "__name__", type(self.step_fn).__name__)
        where = f"service {self.service[:60]!r}" if self.service else "planned in process"
        plans = ", ".join(repr(a.plan.name[:30]) for a in list(self.applied.values())[:3])
        return (f"PlannedStep({name[:40]}, {where}, {len(self.applied)} signatures compiled"
                f"{': ' + plans if plans else ''}{', ...' if len(self.applied) > 3 else ''})")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # the traced arguments' shapes, dtypes and shardings, and the static ones by value (as jax.jit keys its cache)
        dyn_args, dyn_kwargs, _ = self.form.split(args, kwargs)
        sig = (_signature((dyn_args, dyn_kwargs)), self.form.statics(args, kwargs))
        step = self.applied.get(sig)
        if step is None:
            with self._lock:
                step = self.applied.get(sig) or self._running.get(sig)
                if step is None:
                    step = self._compile(sig, args, kwargs)
                if isinstance(step, TrialRun):  # trial steps one at a time, in the same order on every process
                    return step(*args, **kwargs)
        return step(*args, **kwargs)

    # -- planning ----------------------------------------------------------------------------------
    def _compile(self, sig: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        import jax

        import xla_hooks
        from disco.ir.extractor import hlo_text

        text = hlo_text(self.step_fn, *args, kwargs=kwargs)
        if self.trial_count:
            return self._compile_trials(sig, text, args, kwargs)
        if jax.process_count() > 1 and _spans_processes((args, kwargs)):
            applied, report = self._compile_agreed(text, args, kwargs)
        else:
            answer = self._obtain(text, (args, kwargs))
            report = answer.report
            applied = xla_hooks.apply(answer.plan, self.step_fn, *args, kwargs=kwargs)
        self.applied[sig] = applied
        self.reports[sig] = report
        return applied

    def _obtain(self, text: str, inputs: Any) -> _Answer:
        """The plan for the step of HLO ``text`` (``inputs``: the example arguments, which the
        cluster's device count is read from), its report and, with trials, the candidates; or no
        plan and why not, with a :class:`PlanServiceWarning` saying so."""
        from disco.ir.graph import HloGraph

        key, offered = None, None
        try:
            try:
                graph = HloGraph.from_hlo_text(text)
            except Exception as e:  # noqa: BLE001 - a step disco cannot read still trains, as XLA compiles it
                raise NoPlan(f"disco could not read the step's HLO ({type(e).__name__}: {e})") from None
            if self.service is None:
                plan, report = self._local_plan(graph, inputs)
                if self.trial_count:
                    from disco.planner import candidates as planner_candidates

                    offered = planner_candidates(graph, plan, report, self.trial_count)
            else:
                plan, report, key, offered = self._service_plan(text, graph, inputs)
        except NoPlan as e:
            where = self.service or "the local planner"
            reason = " ".join(str(e).split())  # one line, whatever the service or http.client wrote
            warnings.warn(f"disco: no plan from {where} ({reason}); using XLA's default compile",
                          PlanServiceWarning, stacklevel=4)
            return _Answer(None, None, f"no plan from {where}: {reason}")
        plan, report = _for_this_backend(plan, report)
        candidates: tuple[Candidate, ...] = ()
        if self.trial_count:
            candidates = tuple(_candidates(plan, report, offered, graph, self.trial_count))
        return _Answer(plan, report, None, key, candidates)

    def _compile_agreed(self, text: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
        """A multi-process job's compile (:mod:`xla_hooks.agreement`): process 0 obtains the plan and
        publishes it, every process applies those bytes, and every process keeps the plan only
        where all applied it; otherwise all compile XLA's default."""
        import jax

        import xla_hooks
        from disco.plans.plan import FusionPlan
        from xla_hooks import agreement
        from xla_hooks._jax_private import PrivateApiError

        def default() -> Any:
            return xla_hooks.apply(None, self.step_fn, *args, kwargs=kwargs)

        try:
            store = agreement.JaxKeyValue()
        except PrivateApiError as e:  # the same jax on every process: every one falls back here
            warnings.warn(f"disco: the processes cannot share a plan ({e}); every process uses XLA's default "
                          "compile", PlanAgreementWarning, stacklevel=4)
            return default(), None
        digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
        rnd = agreement.new_round(store, digest, jax.process_index(), jax.process_count(), self.agree_timeout_s)
        if rnd.leader:
            try:
                answer = self._obtain(text, (args, kwargs))
                plan, report, reason = answer.plan, answer.report, answer.reason
            except BaseException as e:  # the others need not wait for a plan that will never come
                agreement.publish_plan(rnd, None, None, f"process {rnd.process} raised {type(e).__name__}: {e}")
                raise
            outcome = agreement.publish_plan(rnd, None if plan is None else plan.to_dict(), report, reason)
        else:
            plan_json, report, outcome = agreement.receive_plan(rnd, self.timeout_s + self.agree_timeout_s)
            plan = None
            if plan_json is not None:
                try:
                    plan = FusionPlan.from_dict(plan_json)
                except (ValueError, TypeError) as e:
                    outcome = agreement.Outcome(agreement.APPLY, f"process {rnd.process} read a plan that is not "
                                                                 f"valid ({type(e).__name__}: {e})")
        local = None
        if plan is not None and outcome.ok:
            local = xla_hooks.apply(plan, self.step_fn, *args, kwargs=kwargs)  # warns where it falls back
            if not local.applied:
                outcome = agreement.Outcome(agreement.APPLY, f"plan {plan.name or plan.digest()!r} did not apply "
                                                             f"on process {rnd.process} ({local.fallback_reason})")
        decision = agreement.decide(rnd, outcome)
        if decision.ok and local is not None:
            return local, report
        if decision.kind == agreement.NO_PLAN:
            if not rnd.leader:  # process 0 said why when it failed to obtain the plan
                warnings.warn(f"disco: {decision.reason}; every process uses XLA's default compile",
                              PlanServiceWarning, stacklevel=4)
        else:
            warnings.warn(f"disco: {decision.reason}; every process uses XLA's default compile",
                          PlanAgreementWarning, stacklevel=4)
        return default(), None

    # -- trials --------------------------------------------------------------------------------------
    def _compile_trials(self, sig: Any, text: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A compile with trials: the candidates every process compiled, as a :class:`TrialRun` whose
        last step installs the fastest; or, when there is nothing to measure (one candidate left, a
        measured answer, no plan), the compiled step itself."""
        import jax

        import xla_hooks
        from xla_hooks import agreement
        from xla_hooks._jax_private import PrivateApiError

        def compile_all(candidates: tuple[Candidate, ...], process: int) -> tuple[list[Any], agreement.Outcome]:
            compiled, kept, why = [], [], []
            for c in candidates:
                local = xla_hooks.apply(c.plan, self.step_fn, *args, kwargs=kwargs)  # warns where it falls back
                compiled.append(local)
                kept.append(local.applied)
                if not local.applied:
                    why.append(f"candidate {c.name!r} did not apply on process {process} ({local.fallback_reason})")
            return compiled, agreement.Outcome(None, "; ".join(why) or None, tuple(kept))

        def default() -> Any:
            return xla_hooks.apply(None, self.step_fn, *args, kwargs=kwargs)

        rnd = None
        if jax.process_count() > 1 and _spans_processes((args, kwargs)):
            try:
                store = agreement.JaxKeyValue()
            except PrivateApiError as e:  # the same jax on every process: every one falls back here
                warnings.warn(f"disco: the processes cannot share a plan ({e}); every process uses XLA's default "
                              "compile", PlanAgreementWarning, stacklevel=4)
                return self._install(sig, default(), None)
            digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
            rnd = agreement.new_round(store, digest, jax.process_index(), jax.process_count(), self.agree_timeout_s)
        answer = _Answer(None, None)
        if rnd is None or rnd.leader:
            try:
                answer = self._obtain(text, (args, kwargs))
            except BaseException as e:  # the others need not wait for a plan that will never come
                if rnd is not None:
                    agreement.publish_plan(rnd, None, None, f"process {rnd.process} raised {type(e).__name__}: {e}")
                raise
            candidates = answer.candidates
            if rnd is not None:
                outcome = agreement.publish_plan(rnd, None if answer.plan is None else answer.plan.to_dict(),
                                                 answer.report, answer.reason,
                                                 [c.to_dict() for c in candidates] if answer.plan is not None else None)
            else:
                outcome = agreement.Outcome() if answer.plan is not None else agreement.Outcome(agreement.NO_PLAN)
        else:
            raw, report, outcome = agreement.receive_candidates(rnd, self.timeout_s + self.agree_timeout_s)
            answer = _Answer(None, report)
            candidates = ()
            if raw is not None:
                try:
                    candidates = tuple(Candidate.from_dict(c) for c in raw)
                except (ValueError, TypeError) as e:
                    outcome = agreement.Outcome(agreement.APPLY, f"process {rnd.process} read a candidate plan "
                                                                 f"that is not valid ({type(e).__name__}: {e})")
        compiled: list[Any] = []
        if outcome.ok and candidates:
            compiled, outcome = compile_all(candidates, 0 if rnd is None else rnd.process)
            if rnd is None:
                outcome = agreement.combine_candidates([outcome])
        decision = outcome if rnd is None else agreement.decide(rnd, outcome)
        if not decision.ok:
            if rnd is not None and decision.kind == agreement.NO_PLAN:
                if not rnd.leader:  # process 0 said why when it failed to obtain the plan
                    warnings.warn(f"disco: {decision.reason}; every process uses XLA's default compile",
                                  PlanServiceWarning, stacklevel=4)
            elif decision.kind != agreement.NO_PLAN:
                warnings.warn(f"disco: {decision.reason}; every process uses XLA's default compile",
                              PlanAgreementWarning, stacklevel=4)
            return self._install(sig, default(), None)
        if decision.reason:  # candidates dropped on some process: dropped on all
            warnings.warn(f"disco: {decision.reason}; those candidates are not measured on any process",
                          PlanAgreementWarning, stacklevel=4)
        kept = [i for i, ok in enumerate(decision.applied or ()) if ok]
        candidates = tuple(candidates[i] for i in kept)
        compiled = [compiled[i] for i in kept]
        report = answer.report
        if len(candidates) == 1:
            return self._install(sig, compiled[0], report)
        run: TrialRun

        def finish(samples: list[list[float]]) -> None:
            self._finish_trials(sig, run, rnd, answer, samples)

        run = TrialRun(candidates, compiled, self.trial_steps, finish)
        self._running[sig] = run
        self.reports[sig] = report
        return run

    def _install(self, sig: Any, applied: Any, report: dict[str, Any] | None) -> Any:
        self.applied[sig] = applied
        self.reports[sig] = report
        return applied

    def _finish_trials(self, sig: Any, run: TrialRun, rnd: Any, answer: _Answer, samples: list[list[float]]) -> None:
        """After the last trial step: every process keeps the same winner; process 0 reports the times."""
        from xla_hooks import agreement
        from xla_hooks.trials import summary

        if rnd is None:
            winner, every, outcome = agreement.choose([samples]), [samples], agreement.Outcome()
        else:
            winner, every, outcome = agreement.agree_winner(rnd, samples)
            if not outcome.ok:
                warnings.warn(f"disco: {outcome.reason}", PlanAgreementWarning, stacklevel=4)
            elif outcome.reason:
                warnings.warn(f"disco: the trial winner was chosen without some processes' times "
                              f"({outcome.reason})", PlanAgreementWarning, stacklevel=4)
        table = summary(run.candidates, every if every is not None else [samples], winner)
        self.trials[sig] = table
        self.reports[sig] = {**(answer.report or self.reports.get(sig) or {}), "trials": table}
        self.applied[sig] = run.compiled[winner]
        self._running.pop(sig, None)
        leader = rnd is None or rnd.leader
        if leader and every is not None and self.service is not None and answer.key is not None:
            self._report_trials(answer.key, run, every, winner)

    def _report_trials(self, key: str, run: TrialRun, every: list[list[list[float]]], winner: int) -> None:
        """``POST /v1/trials`` within ``timeout_s``; a failure is a :class:`TrialReportWarning`, never an error."""
        from xla_hooks.trials import report_body

        body = report_body(key, run.candidates, every, winner)
        try:
            self._client().report_trials(body)
        except NoPlan as e:
            reason = " ".join(str(e).split())
            warnings.warn(f"disco: the trial measurements were not reported to {self.service} ({reason}); the job "
                          f"keeps {run.candidates[winner].name!r}, and the next job of this program runs trials again",
                          TrialReportWarning, stacklevel=5)

    def _client(self) -> ServiceClient:
        assert self.service is not None  # only called on the service's path
        return ServiceClient(self.service, self.token, self.timeout_s)

    def _cluster(self, inputs: Any) -> Any:
        """``cluster`` as given, or for "auto" the preset of the devices the step runs on: "local"
        on CPU, the H100 preset of this many GPUs (:func:`disco.sim.cluster.machine_preset`)."""
        if self.cluster != "auto":
            return self.cluster
        import jax

        from disco.sim.cluster import machine_preset

        first = jax.devices()[0]
        name = machine_preset(first.platform, first.device_kind, devices_of(inputs))
        if name is None:
            raise NoPlan(f"no cluster preset describes {devices_of(inputs)} x {first.device_kind!r}, whose kernels "
                         "the cost models were not trained for; pass cluster= a preset name or a ClusterSpec")
        return name

    def _cluster_spec(self, inputs: Any) -> Any:
        from disco.sim.cluster import ClusterSpec, preset

        cluster = self._cluster(inputs)
        if isinstance(cluster, ClusterSpec):
            return cluster
        if cluster == "local":
            return preset("local", devices=devices_of(inputs))
        return preset(cluster)

    def _local_plan(self, graph: Any, inputs: Any) -> tuple[Any, dict[str, Any]]:
        try:
            from disco.planner import Cancelled, plan_for_graph

            deadline = time.monotonic() + self.timeout_s

            def progress(frac: float, msg: str) -> None:
                if time.monotonic() > deadline:
                    raise Cancelled(f"the local planner ran past timeout_s={self.timeout_s:g}")

            options = {"budget_s": max(0.1, min(10.0, self.timeout_s * 0.5)), **self.options}
            plan, report = plan_for_graph(graph, self._cluster_spec(inputs), options, progress)
            return plan.validate(graph), report
        except NoPlan:
            raise
        except Exception as e:  # noqa: BLE001 - any planner failure falls back
            raise NoPlan(f"{type(e).__name__}: {e}") from None

    def _service_plan(self, text: str, graph: Any, inputs: Any
                      ) -> tuple[Any, dict[str, Any], str | None, list[Any] | None]:
        """The service's plan and report, the key it was stored under and, with trials, the
        candidates it offered (None where it offered none: an older service, or a measured winner)."""
        from disco.sim.cluster import ClusterSpec
        from disco.plans.plan import FusionPlan
        from xla_hooks.environment import current as current_environment

        body: dict[str, Any] = {"hlo_text": text}
        cluster = self._cluster(inputs)
        if isinstance(cluster, ClusterSpec):
            body["cluster"] = {"yaml": cluster.to_yaml()}
        else:
            body["cluster"] = cluster
            if cluster == "local":
                body["devices"] = devices_of(inputs)
        if self.options:
            body["options"] = self.options
        environment = current_environment().to_dict()
        body["environment"] = environment
        if self.trial_count:
            body["candidates"] = self.trial_count
        data = self._client().plan(body, self.trial_count)
        if not isinstance(data, dict) or not isinstance(data.get("plan"), dict):
            raise NoPlan(f"the service's answer holds no plan: {str(data)[:200]}")
        try:
            plan = FusionPlan.from_dict(data["plan"])
        except (ValueError, TypeError) as e:
            raise NoPlan(f"the service's answer is not a valid plan: {e}") from None
        try:
            plan.validate(graph)
        except (ValueError, TypeError) as e:
            raise NoPlan(f"the service's plan does not fit this step: {e}") from None
        report = data.get("report") if isinstance(data.get("report"), dict) else {}
        if report.get("environment") != environment:  # the key holds it: a plan for another key
            raise NoPlan(f"the service answered a plan made for another environment: "
                          f"{str(report.get('environment'))[:300]}, this job's is {environment}")
        if isinstance(data.get("measured"), dict):
            report = {**report, "measured": data["measured"]}
        key = data.get("key") if isinstance(data.get("key"), str) else None
        offered = data.get("candidates") if isinstance(data.get("candidates"), list) else None
        return plan, report, key, offered


def jit(step_fn: Callable[..., Any], service: str | None = None, cluster: Any = "auto",
        timeout_s: float = 30.0, token: str | None = None, *,
        options: Mapping[str, Any] | None = None,
        agree_timeout_s: float = DEFAULT_AGREE_TIMEOUT_S, trials: int = 0,
        trial_steps: int = DEFAULT_TRIAL_STEPS) -> PlannedStep:
    """Wraps ``step_fn`` like ``jax.jit``, compiling it with a disco plan on first use.

    Args:
      step_fn: the training step (plain or jitted).
      service: the plan service's base URL (e.g. "http://127.0.0.1:8000"), or None to
        plan in this process with :func:`disco.planner.plan_for_graph`.
      cluster: a preset name ("local" uses the step's device count) or a ClusterSpec; "auto" (the
        default): the devices the step runs on, "local" on CPU and the H100 preset of that many GPUs
        (``h100-1``, ``h100-sxm-8``; other GPUs fall back with a warning asking for a cluster).
      timeout_s: how long planning may take in all (requests, job, polling). A service job that takes
        longer goes on there; a later run of the step gets its plan. A GPU cluster's job on a server with
        the compiled tier compiles up to 8 plans deviceless first (minutes: docs/guides/plan-service.md).
      token: bearer token for the service's write endpoints (surrounding whitespace is dropped).
      options: planner options (budget_s, strategy, seed, max_evals, tier) sent with the request.
      agree_timeout_s: in a multi-process job (``jax.process_count() > 1``), how long a process waits
        for another's report that the plan applied, or for process 0's decision (twice this); the
        others wait ``timeout_s + agree_timeout_s`` for process 0's plan. Process 0 alone obtains the
        plan and publishes it through jax's coordination service; every process applies it, or, if
        it failed anywhere or a wait timed out, every process uses XLA's default
        (:mod:`xla_hooks.agreement`). A single-process job uses no key-value store.
      trials: 0 (the default): use the plan as answered. ``n`` >= 1: measure inside the job
        (:mod:`xla_hooks.trials`): the service's ``n`` best candidates and XLA's default are each
        compiled ahead (one that does not apply on some process is dropped on all), the first
        ``trial_steps`` rounds of steps run each once, in turn (real steps: a plan never changes what
        the step computes), the fastest is kept, and the step times are reported to the service
        (``POST /v1/trials``), which answers the next job of the same plan key with that winner
        (then no trials run). ``.trials`` shows the measurements.
      trial_steps: rounds of steps, one step per candidate each (at least 1; the first round is not timed
        where there are more).

    Returns:
      A callable with ``step_fn``'s signature; ``.applied``/``.reports`` show what was used.

    Raises:
      TypeError: for a ``step_fn`` that is not callable, or a ``token`` that is not a str.
      ValueError: for a ``timeout_s`` or ``agree_timeout_s`` that is not a positive number, a ``service`` that is not an
        http(s) URL with a host (and no query, fragment, user name, whitespace or non-ASCII), a
        ``token`` an HTTP header cannot carry, a ``cluster`` that is neither a ClusterSpec nor a preset name, or
        ``options`` the planner refuses (setup errors; everything that goes wrong later falls back).

    Warns:
      PlanServiceWarning: no plan was obtained; XLA's default compile is used.
      PlanFallbackWarning: the plan could not be applied (from :func:`xla_hooks.apply`).
      PlanAgreementWarning: in a multi-process job, the plan did not apply on every process (or a
        candidate was dropped, or the trial winner did not arrive in time).
      TrialReportWarning: the trial measurements could not be reported to the service.
    """
    from disco.ir.extractor import check_step
    from disco.planner import check_options

    check_step(step_fn)
    for name, value, low in (("trials", trials, 0), ("trial_steps", trial_steps, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name}: expected an integer >= {low}, got {value!r}")
    if trials > 8:  # service.limits.MAX_CANDIDATES: the service answers no more
        raise ValueError(f"trials: expected at most 8 candidates (what the plan service answers), got {trials}")
    for name, value in (("timeout_s", timeout_s), ("agree_timeout_s", agree_timeout_s)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
            raise ValueError(f"{name}: expected a positive number of seconds, got {value!r}")
    if service is not None:
        check_service_url(service)
    token = checked_token(token)
    _check_cluster(cluster)
    check_options(options)
    return PlannedStep(step_fn, service=service, cluster=cluster, timeout_s=timeout_s, token=token,
                       options=options, agree_timeout_s=agree_timeout_s, trials=trials, trial_steps=trial_steps)


def _check_cluster(cluster: Any) -> None:
    """ValueError unless ``cluster`` is a ClusterSpec or a preset's name (what the planner and the
    service take)."""
    from disco.sim.cluster import PRESETS, ClusterSpec

    if not isinstance(cluster, ClusterSpec) and not (isinstance(cluster, str) and cluster in (*PRESETS, "auto")):
        raise ValueError(f"cluster: expected a ClusterSpec, 'auto' or a preset name ({', '.join(PRESETS)}), "
                         f"got {cluster!r:.80}")


def _candidates(plan: Any, report: dict[str, Any] | None, offered: list[Any] | None, graph: Any,
                n: int) -> list[Candidate]:
    """The candidates a job measures: the plan first, then what the service (or the local planner)
    offered that fits this step, at most ``n``, then XLA's default (:func:`xla_hooks.trials.with_default`).
    A measured answer is the plan alone: it was measured already."""
    from xla_hooks.trials import with_default

    report = report or {}
    first = Candidate(plan.name or plan.digest(), report.get("plan_ms"), plan)
    if plan.name == "xla_default" and not plan.groups and plan.buckets is None and not plan.cuts:
        first = Candidate("xla_default", report.get("plan_ms"), None)
    if "measured" in report:
        return [first]
    out, seen = [first], {plan.digest()}
    for entry in offered or ():
        if len(out) >= n:
            break
        try:
            cand = Candidate.from_dict(entry)
            if cand.plan is not None:
                cand.plan.validate(graph)
                cand = dataclasses.replace(cand, plan=_for_this_backend(cand.plan, None)[0])
        except (ValueError, TypeError):  # a candidate that does not fit is not measured
            continue
        digest = cand.plan.digest() if cand.plan is not None else "xla_default"
        if digest in seen or (cand.plan is None and any(c.plan is None for c in out)):
            continue
        seen.add(digest)
        out.append(cand)
    return with_default(out, report)


def _for_this_backend(plan: Any, report: dict[str, Any] | None) -> tuple[Any, dict[str, Any] | None]:
    """On a GPU the plan's fusion groups are dropped (XLA:GPU cannot take them:
    ``disco.plans.check.GPU_GROUPS_REASON``), so its cuts, buckets and options still apply; the
    report says so. A planner that knew the backend would not have made them."""
    import jax

    from disco.plans.options import normalize

    if plan is None or not plan.groups or normalize(jax.default_backend()) != "gpu":
        return plan, report
    from disco.plans.check import GPU_GROUPS_REASON

    out = dict(report or {})
    out["dropped_groups"] = f"{len(plan.groups)} fusion group(s) dropped: {GPU_GROUPS_REASON}"
    return plan.replace(groups=(), xla_fusion="extend"), out
