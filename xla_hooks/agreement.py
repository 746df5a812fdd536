"""One plan per multi-process job: process 0 obtains it, every process applies the same bytes, all agree.

In a ``jax.distributed`` job every process compiles the same step, and each compiled program runs
collectives with the others: if one process applied a bucket plan and another compiled XLA's
default, their collectives differ and the job hangs or aborts. So for each compile of a step
(a *round*) the lowest process index (process 0) obtains the plan (from the service, or the local
planner) and publishes it through jax's coordination-service key-value store, the way jax shares
profile-guided profiles between hosts; every process applies those bytes and reports whether the
plan applied on it; process 0 collects the reports and publishes the decision: the plan on every
process, or XLA's default on every process. Every wait is bounded and a timeout names the key
and the process it waited for.

A round's keys are ``disco/xla_hooks/<program digest>/<n>/...``: the digest of the step's HLO
and ``n``, how many rounds this process ran for that program before, so a step compiled again (a
new signature of the same program, a new ``xla_hooks.jit``) never reads the keys of an earlier
compile. Every process compiles the same programs in the same order, so their counters agree.

A job that measures candidate plans (``xla_hooks.jit(..., trials=n)``) runs the same round with
a list: process 0 publishes every candidate, each process reports which of them applied on it
(``Outcome.applied``), and the decision keeps those that applied everywhere. After the trial
steps each process publishes its step times (``<prefix>/timings/<p>``); process 0 picks the
candidate whose median step time, each step taken on the slowest process, is lowest
(:func:`choose`), and publishes it (``<prefix>/winner``), so every process keeps the same plan.

The store is anything with ``set(key, bytes)`` and ``get(key, timeout_s) -> bytes`` (raising
:class:`KeyTimeout`): :class:`JaxKeyValue` in a job, a dict behind a condition in the tests.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import threading
import time
from typing import Any, Protocol

DEFAULT_AGREE_TIMEOUT_S = 60.0
LEADER = 0
_PREFIX = "disco/xla_hooks"

# why a process has no plan in effect; process 0's decision carries the first failure's kind
NO_PLAN = "no_plan"      # process 0 obtained no plan (service down, slow, an invalid answer)
RECEIVE = "receive"      # the plan did not reach this process (timeout, corrupt bytes)
APPLY = "apply"          # the plan did not apply on this process (invalid for its step, compile failed)
TIMEOUT = "timeout"      # a report or the decision did not arrive in time


class KeyValueError(Exception):
    """Reading or writing the key-value store failed."""


class KeyTimeout(KeyValueError):
    """A key did not appear within the time waited for it."""


class KeyValue(Protocol):
    def set(self, key: str, value: bytes) -> None: ...

    def get(self, key: str, timeout_s: float) -> bytes: ...


class JaxKeyValue:
    """jax's coordination-service key-value store (:func:`xla_hooks._jax_private.kv_client`).

    Raises:
      PrivateApiError: (on construction) the client is not there or not what it was.
    """

    def __init__(self) -> None:
        from xla_hooks._jax_private import kv_client

        self._client = kv_client()

    def set(self, key: str, value: bytes) -> None:
        try:
            self._client.key_value_set_bytes(key, value)
        except Exception as e:  # noqa: BLE001 - jaxlib raises its own runtime error type
            raise KeyValueError(f"setting key {key!r} failed: {_first_line(e)}") from None

    def get(self, key: str, timeout_s: float) -> bytes:
        try:
            return bytes(self._client.blocking_key_value_get_bytes(key, max(1, int(timeout_s * 1000))))
        except Exception as e:  # noqa: BLE001 - jaxlib raises its own runtime error type
            text = str(e)
            if "DEADLINE_EXCEEDED" in text or "timed out" in text.lower():
                raise KeyTimeout(key) from None
            raise KeyValueError(f"reading key {key!r} failed: {_first_line(e)}") from None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


@dataclasses.dataclass(frozen=True)
class Round:
    """The keys and timeouts of one compile's agreement.

    Attributes:
      store: the key-value store.
      prefix: ``disco/xla_hooks/<program digest>/<n>``.
      program: the program digest (published with the plan, checked by every process).
      process: this process's index; processes: how many there are.
      timeout_s: how long a process waits for another's report, or for the decision.
    """

    store: KeyValue
    prefix: str
    program: str
    process: int
    processes: int
    timeout_s: float

    @property
    def leader(self) -> bool:
        return self.process == LEADER

    def plan_key(self) -> str:
        return f"{self.prefix}/plan"

    def report_key(self, process: int) -> str:
        return f"{self.prefix}/applied/{process}"

    def decision_key(self) -> str:
        return f"{self.prefix}/decision"

    def timings_key(self, process: int) -> str:
        return f"{self.prefix}/timings/{process}"

    def winner_key(self) -> str:
        return f"{self.prefix}/winner"


_rounds_lock = threading.Lock()
_rounds: dict[str, int] = {}


def new_round(store: KeyValue, program: str, process: int, processes: int, timeout_s: float) -> Round:
    """The next round of ``program`` (a digest of the step's HLO) in this process.

    Raises:
      ValueError: for a process index outside ``range(processes)`` or a timeout that is not positive.
    """
    if not 0 <= process < processes:
        raise ValueError(f"process: expected an index in [0, {processes}), got {process}")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s: expected a positive number of seconds, got {timeout_s!r}")
    with _rounds_lock:
        n = _rounds.get(program, 0)
        _rounds[program] = n + 1
    return Round(store, f"{_PREFIX}/{program[:32]}/{n}", program, process, processes, float(timeout_s))


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a process has in effect after a step: ``kind`` None when it holds the plan, else why not.

    ``applied``: with candidates, which of them applied (on this process; in a decision, on every
    process); None for a round of one plan.
    """

    kind: str | None = None
    reason: str | None = None
    applied: tuple[bool, ...] | None = None

    @property
    def ok(self) -> bool:
        return self.kind is None

    def to_bytes(self) -> bytes:
        body: dict[str, Any] = {"kind": self.kind, "reason": self.reason}
        if self.applied is not None:
            body["applied"] = list(self.applied)
        return json.dumps(body).encode()

    @classmethod
    def from_bytes(cls, raw: bytes, what: str) -> Outcome:
        try:
            d = json.loads(raw)
            kind, reason, applied = d["kind"], d["reason"], d.get("applied")
            if not (kind is None or isinstance(kind, str)) or not (reason is None or isinstance(reason, str)):
                raise TypeError(f"kind and reason must be strings or null, got {kind!r} and {reason!r}")
            if applied is not None and not (isinstance(applied, list) and all(isinstance(a, bool) for a in applied)):
                raise TypeError(f"applied must be a list of booleans or absent, got {str(applied)[:80]}")
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            return cls(RECEIVE, f"{what} is not an agreement report ({type(e).__name__}: {e}): {raw[:80]!r}")
        return cls(kind, reason, None if applied is None else tuple(applied))


def publish_plan(rnd: Round, plan: dict[str, Any] | None, report: dict[str, Any] | None,
                 reason: str | None, candidates: list[dict[str, Any]] | None = None) -> Outcome:
    """Process 0: publishes the plan it obtained (``plan`` None: none, and ``reason`` why).

    Args:
      candidates: for a job that runs trials, every candidate (``{"name", "predicted_ms", "plan"}``),
        ``plan`` the first's.

    Returns:
      Process 0's own outcome so far: the plan to apply, or :data:`NO_PLAN`.
    """
    body = {"program": rnd.program, "plan": plan, "report": report, "reason": reason}
    if candidates is not None:
        body["candidates"] = candidates
    outcome = Outcome() if plan is not None else Outcome(NO_PLAN, f"process {LEADER} obtained no plan ({reason})")
    try:
        rnd.store.set(rnd.plan_key(), json.dumps(body).encode())
    except KeyValueError as e:  # the others time out waiting for it and report that
        return Outcome(TIMEOUT, f"process {LEADER} could not publish the plan: {e}")
    return outcome


def receive_plan(rnd: Round, wait_s: float) -> tuple[dict[str, Any] | None, dict[str, Any] | None, Outcome]:
    """Every other process: waits up to ``wait_s`` for process 0's plan.

    Returns:
      ``(plan, report, outcome)``: the plan's JSON (None when there is none to apply), the
      planner's report, and this process's outcome so far.
    """
    plan, report, outcome, _ = _receive(rnd, wait_s)
    return plan, report, outcome


def receive_candidates(rnd: Round, wait_s: float
                       ) -> tuple[list[dict[str, Any]] | None, dict[str, Any] | None, Outcome]:
    """Every other process of a job that runs trials: waits up to ``wait_s`` for process 0's candidates.

    Returns:
      ``(candidates, report, outcome)``: ``[{"name", "predicted_ms", "plan"}]`` (None when there is
      no plan to apply), the planner's report, and this process's outcome so far.
    """
    plan, report, outcome, body = _receive(rnd, wait_s)
    if plan is None:
        return None, report, outcome
    candidates = body.get("candidates")
    if not (isinstance(candidates, list) and candidates
            and all(isinstance(c, dict) and isinstance(c.get("plan"), dict) for c in candidates)):
        return None, None, Outcome(RECEIVE, f"process {rnd.process} read key {rnd.plan_key()!r} without a list "
                                            f"of candidate plans: {str(candidates)[:80]}")
    return candidates, report, outcome


def _receive(rnd: Round, wait_s: float
             ) -> tuple[dict[str, Any] | None, dict[str, Any] | None, Outcome, dict[str, Any]]:
    """Waits for process 0's published body: ``(plan, report, outcome, body)``."""
    key = rnd.plan_key()

    def failed(reason: str) -> tuple[None, None, Outcome, dict[str, Any]]:
        return None, None, Outcome(RECEIVE, reason), {}

    try:
        raw = rnd.store.get(key, wait_s)
    except KeyTimeout:
        return failed(f"process {rnd.process} got no plan from process {LEADER} within {wait_s:g} s "
                      f"(waited for key {key!r})")
    except KeyValueError as e:
        return failed(f"process {rnd.process}: {e}")
    try:
        body = json.loads(raw)
        if not isinstance(body, dict):
            raise TypeError(f"expected a JSON object, got {type(body).__name__}")
        plan, report = body.get("plan"), body.get("report")
        if not (plan is None or isinstance(plan, dict)) or not (report is None or isinstance(report, dict)):
            raise TypeError("plan and report must be JSON objects or null")
    except (ValueError, TypeError) as e:
        return failed(f"process {rnd.process} read key {key!r} that is not a published plan "
                      f"({type(e).__name__}: {e}): {raw[:80]!r}")
    if body.get("program") != rnd.program:
        return failed(f"process {LEADER} published a plan for program {str(body.get('program'))[:16]}, process "
                      f"{rnd.process} compiles {rnd.program[:16]} (the processes compile different steps)")
    if plan is None:
        return None, report, Outcome(NO_PLAN, f"process {LEADER} obtained no plan ({body.get('reason')})"), body
    return plan, report, Outcome(), body


def combine_candidates(outcomes: list[Outcome]) -> Outcome:
    """The decision of a round of candidates from every process's (ok) outcome: the candidates that
    applied on every process, and why the others were dropped; :data:`APPLY` when none is left."""
    counts = {len(o.applied or ()) for o in outcomes}
    if len(counts) != 1:
        return Outcome(RECEIVE, f"the processes report different numbers of candidates: {sorted(counts)}")
    kept = tuple(all(col) for col in zip(*(o.applied or () for o in outcomes)))
    why = "; ".join(o.reason for o in outcomes if o.reason) or None
    if not any(kept):
        return Outcome(APPLY, f"no candidate plan applied on every process ({why})")
    return Outcome(None, why, kept)


def decide(rnd: Round, outcome: Outcome) -> Outcome:
    """Every process: reports its outcome and returns the job's: ok only where every process applied.

    Process 0 waits up to ``rnd.timeout_s`` in all for the others' reports, then publishes the
    decision; the others wait up to twice that for it (process 0 may still be compiling).
    """
    try:
        rnd.store.set(rnd.report_key(rnd.process), outcome.to_bytes())
    except KeyValueError as e:
        outcome = Outcome(TIMEOUT, f"process {rnd.process} could not report: {e}")
    if not rnd.leader:
        key = rnd.decision_key()
        wait_s = 2 * rnd.timeout_s
        try:
            decision = Outcome.from_bytes(rnd.store.get(key, wait_s), f"key {key!r}")
        except KeyTimeout:
            decision = Outcome(TIMEOUT, f"process {rnd.process} got no decision from process {LEADER} within "
                                        f"{wait_s:g} s (waited for key {key!r})")
        except KeyValueError as e:
            decision = Outcome(TIMEOUT, f"process {rnd.process}: {e}")
        return decision if not decision.ok else outcome if not outcome.ok else decision
    failures = [] if outcome.ok else [outcome]
    mine = [outcome] if outcome.ok and outcome.applied is not None else []
    deadline = time.monotonic() + rnd.timeout_s
    for p in range(rnd.processes):
        if p == rnd.process:
            continue
        key = rnd.report_key(p)
        try:
            theirs = Outcome.from_bytes(rnd.store.get(key, max(0.001, deadline - time.monotonic())),
                                        f"key {key!r}")
        except KeyTimeout:
            theirs = Outcome(TIMEOUT, f"process {p} did not report within {rnd.timeout_s:g} s "
                                      f"(process {rnd.process} waited for key {key!r})")
        except KeyValueError as e:
            theirs = Outcome(TIMEOUT, f"process {rnd.process}: {e}")
        if not theirs.ok:
            failures.append(theirs)
        elif theirs.applied is not None:
            mine.append(theirs)
    decision = failures[0] if failures else Outcome()
    if len(failures) > 1:
        decision = Outcome(decision.kind, f"{decision.reason}; and {len(failures) - 1} more")
    if decision.ok and mine:
        decision = combine_candidates(mine)
    try:
        rnd.store.set(rnd.decision_key(), decision.to_bytes())
    except KeyValueError as e:  # the others time out waiting for it, and fall back
        return Outcome(TIMEOUT, f"process {LEADER} could not publish the decision: {e}")
    return decision


def choose(samples: list[list[list[float]]]) -> int:
    """The fastest candidate: ``samples[p][c]`` holds process ``p``'s step times of candidate ``c``.

    A data-parallel step is as slow as its slowest process, so each step counts with its time on
    the slowest process; the candidate with the lowest median of those wins (on a tie, the first:
    the one predicted best).

    Raises:
      ValueError: no processes, or processes with different numbers of candidates or steps.
    """
    if not samples or len({len(per) for per in samples}) != 1:
        raise ValueError(f"choose: expected the same candidates on every process, got "
                         f"{[len(per) for per in samples]} candidates")
    medians = []
    for c in range(len(samples[0])):
        rows = [per[c] for per in samples]
        if len({len(r) for r in rows}) != 1 or not rows[0]:
            raise ValueError(f"choose: candidate {c}: expected the same number (>= 1) of steps on every process, "
                             f"got {[len(r) for r in rows]}")
        medians.append(statistics.median(max(step) for step in zip(*rows)))
    return min(range(len(medians)), key=lambda c: (medians[c], c))


def agree_winner(rnd: Round, samples: list[list[float]]) -> tuple[int, list[list[list[float]]] | None, Outcome]:
    """Every process of a job that ran trials: publishes its step times (``samples[c]``: candidate
    ``c``'s) and returns the candidate every process keeps.

    Process 0 waits up to ``rnd.timeout_s`` in all for the others' times, chooses (:func:`choose`,
    over the processes that answered) and publishes the winner; the others wait up to twice that.

    Returns:
      ``(winner, samples, outcome)``: the winner's index; every answering process's times
      (``[p][c][step]``, as process 0 published them with the winner; None where they did not
      arrive); ``outcome`` not ok where a wait timed out or bytes were corrupt. A process that got no decision keeps candidate 0 (the one predicted best), which is
      process 0's choice too when nobody else's times reached it and its own did not decide.
    """
    try:
        rnd.store.set(rnd.timings_key(rnd.process), json.dumps(samples).encode())
    except KeyValueError as e:
        problem: Outcome | None = Outcome(TIMEOUT, f"process {rnd.process} could not publish its step times: {e}")
    else:
        problem = None
    if not rnd.leader:
        key, wait_s = rnd.winner_key(), 2 * rnd.timeout_s
        try:
            body = json.loads(rnd.store.get(key, wait_s))
            winner = body["winner"]
            if isinstance(winner, bool) or not isinstance(winner, int) or not 0 <= winner < len(samples):
                raise ValueError(f"winner {winner!r} is not the index of one of {len(samples)} candidates")
            every = body.get("samples")
            choose(every)  # raises for anything but times of the same candidates and steps
        except KeyTimeout:
            return 0, None, Outcome(TIMEOUT, f"process {rnd.process} got no trial winner from process {LEADER} "
                                              f"within {wait_s:g} s (waited for key {key!r}); it keeps candidate 0")
        except (KeyValueError, ValueError, TypeError, KeyError) as e:
            return 0, None, Outcome(RECEIVE, f"process {rnd.process} could not read the trial winner "
                                              f"({type(e).__name__}: {e}); it keeps candidate 0")
        return winner, every, problem or Outcome(None, body.get("reason"))
    every = [samples]
    missing = []
    deadline = time.monotonic() + rnd.timeout_s
    for p in range(1, rnd.processes):
        key = rnd.timings_key(p)
        try:
            theirs = json.loads(rnd.store.get(key, max(0.001, deadline - time.monotonic())))
            choose([samples, theirs])  # raises for times of other candidates or steps
            every.append(theirs)
        except KeyTimeout:
            missing.append(f"process {p} sent no step times within {rnd.timeout_s:g} s (waited for key {key!r})")
        except (KeyValueError, ValueError, TypeError) as e:
            missing.append(f"process {p}'s step times are unreadable ({type(e).__name__}: {e})")
    winner = choose(every)
    reason = "; ".join(missing) or None
    try:
        rnd.store.set(rnd.winner_key(), json.dumps({"winner": winner, "reason": reason, "samples": every}).encode())
    except KeyValueError as e:
        return winner, every, Outcome(TIMEOUT, f"process {LEADER} could not publish the trial winner: {e}")
    return winner, every, problem or Outcome(None, reason)
