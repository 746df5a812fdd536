"""The options of ``optimize``: one immutable, validated config."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from disco import search
from disco.sim.cluster_spec import parse_bytes

# progress(phase, fraction done in [0, 1], message); phases: "extract", "search", "compile", "measure",
# "run-off", "confirm" (each step reports its own fraction)
Progress = Callable[[str, float, str], None]


def no_progress(phase: str, fraction: float, message: str) -> None:
    """A :data:`Progress` that reports nothing."""


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


_FLAGS = ("learn", "measure_buckets_only", "measure_reduce_fusion", "measure_bound", "measure_regrouped", "confirm")


@dataclasses.dataclass(frozen=True)
class OptimizeConfig:
    """What ``optimize`` searches and how it measures; validated when built.

    Attributes:
      budget_s: seconds for the search (extraction and measurement come on top).
      max_evals: also stop the search after this many plan evaluations; with it, a seed
        always searches the same plans (unless ``budget_s`` runs out first). None: time only.
      strategy: the search strategy, one of ``disco.search.STRATEGIES``.
      measure_top_k: how many plans the model ranks fastest are measured in each round of the
        funnel (:func:`disco.optimizer.funnel`), of those not measured yet.
      measure_rounds: the funnel's rounds (search on the model, measure its top plans, refit the
        correction): the measurement budget, about ``measure_rounds * measure_top_k`` plans besides
        the references of the first round. The search's ``budget_s`` is shared among them.
      compiled_top_k: the funnel's compiled stage (:mod:`disco.optimizer._compiled`): in each round,
        this many unmeasured plans the emulated model ranks fastest are compiled by XLA and priced
        by the compiled tier, and the ``measure_top_k`` measured are those that price ranks fastest
        (each compiled once per run; a plan that does not compile drops out with a warning). 0: off
        (the emulated ranking picks). CPU devices only (a warning says it did not run elsewhere).
      learn: refit the machine's correction of the simulator after every round from the plans
        measured (:mod:`disco.calibrate.correction`); False: the simulator alone ranks every round.
      correction_file: where the machine's correction is kept between runs
        (:mod:`disco.calibrate.kept`; ``disco optimize`` passes its per-user cache file): read
        before the first round, written after the last. None: nothing kept, nothing read.
      seed: the search's seed.
      rounds: interleaved measurement rounds. Compiles dominate the measuring time, so
        rounds are cheap and steady the medians the choice is made on (docs/archive/lab-notebook.md,
        "disco optimize across the zoo").
      steps: steps per round.
      measure_buckets_only: also pool each searched plan with its fusion groups removed
        (``disco_<k>_buckets``: XLA fuses, the plan's buckets stay), so a plan whose groups were
        mispriced can still contribute its bucketing (measured when the model ranks it on top).
      measure_reduce_fusion: on CPU devices, also measure :func:`disco.search.reduce_fusion`'s
        groups (each reduce fused with its elementwise producers) on the best predicted
        baseline's buckets (row ``reduce_fusion``): measured rather than simulated because the
        simulator does not model the YNNPACK calls the groups replace (docs/archive/lab-notebook.md,
        "disco optimize with the reduce_fusion candidate and the confirmation against the best baseline").
      measure_bound: also measure the communication-free bound in the same rounds (the step
        with its all-reduces replaced by copies; not a plan).
      bucket_sweep: bucket counts ``k`` whose ``even_<k>`` plans (the gradients cut into
        ``k`` buckets of equal bytes) join the funnel's pool (measured when the model ranks them
        on top); ``()``: none.
      finalists: how many of the fastest measured plans go to the run-off; 1 skips it.
        Only with ``confirm``.
      measure_regrouped: also measure, in the run-off, the fastest fusing plan's fusion
        decisions on the fastest baseline's buckets when the two differ (row
        ``<plan>_on_<baseline>``): the search's plans carry the buckets the simulator preferred,
        and the measurement can find another bucketing faster.
      confirm: measure the chosen plan again against xla_default (and the best baseline) in fresh rounds and keep
        it only if it is faster there too.
      confirm_rounds: the confirmation's rounds; None: :attr:`confirmation_rounds`'s default.
      memory_limit: bytes per device (an integer, or a string such as "2GB" or "512MiB"); a plan
        whose compiled step's peak device memory (XLA's memory analysis,
        :func:`disco.sim.memory.peak_memory`) is above the lesser of it and the cluster's
        ``device_memory_bytes`` is measured but never chosen (its row's ``over_memory`` says
        why). None: the cluster's memory alone (none known: no limit). XLA's default is never
        left out: it is the step as written.

    Raises:
      ValueError: for an unknown strategy, a budget that is not positive, ``measure_top_k``
        below 0, ``compiled_top_k`` below 0, ``measure_rounds`` below 1, a ``correction_file`` that is not a path, a flag that is not a bool, a seed that is not an integer, a bucket count below 1, ``finalists`` below 1, a ``memory_limit`` that is no size, rounds/steps below 1 or
        ``confirm_rounds`` below 1, naming the value received.
    """

    budget_s: float = 60
    max_evals: int | None = None
    strategy: str = "best_first"
    measure_top_k: int = 3
    measure_rounds: int = 3
    compiled_top_k: int = 0
    learn: bool = True
    correction_file: str | None = None
    seed: int = 0
    rounds: int = 9
    steps: int = 3
    measure_buckets_only: bool = True
    measure_reduce_fusion: bool = True
    measure_bound: bool = True
    bucket_sweep: tuple[int, ...] = (2, 3, 4)
    finalists: int = 3
    measure_regrouped: bool = True
    confirm: bool = True
    confirm_rounds: int | None = None
    memory_limit: int | None = None

    def __post_init__(self) -> None:
        if self.memory_limit is not None:
            object.__setattr__(self, "memory_limit", parse_bytes(self.memory_limit, "memory_limit"))
        try:
            object.__setattr__(self, "bucket_sweep", tuple(self.bucket_sweep))
        except TypeError:  # not iterable: bucket_sweep=4 for (4,)
            raise ValueError(f"bucket_sweep: expected bucket counts (integers >= 1), got {self.bucket_sweep!r}") from None
        if self.strategy not in search.STRATEGIES:
            raise ValueError(f"unknown search strategy {self.strategy!r}; expected one of: "
                             f"{', '.join(search.STRATEGIES)}")
        search.check_budgets(self.budget_s, self.max_evals)
        flags = {f: getattr(self, f) for f in _FLAGS if not isinstance(getattr(self, f), bool)}
        if flags:
            raise ValueError(f"expected True or False for {', '.join(f'{k}={v!r}' for k, v in flags.items())}")
        if not _is_int(self.seed):
            raise ValueError(f"seed: expected an integer, got {self.seed!r}")
        if not _is_int(self.measure_top_k) or self.measure_top_k < 0:
            raise ValueError(f"measure_top_k: expected an integer >= 0, got {self.measure_top_k!r}")
        if not _is_int(self.compiled_top_k) or self.compiled_top_k < 0:
            raise ValueError(f"compiled_top_k: expected an integer >= 0, got {self.compiled_top_k!r}")
        if not _is_int(self.measure_rounds) or self.measure_rounds < 1:
            raise ValueError(f"measure_rounds: expected an integer >= 1, got {self.measure_rounds!r}")
        if self.correction_file is not None and (not isinstance(self.correction_file, str)
                                                 or not self.correction_file):
            raise ValueError(f"correction_file: expected a file path or None, got {self.correction_file!r}")
        if any(not _is_int(k) or k < 1 for k in self.bucket_sweep):
            raise ValueError(f"bucket_sweep: expected bucket counts (integers >= 1), got {self.bucket_sweep!r}")
        if not _is_int(self.finalists) or self.finalists < 1:
            raise ValueError(f"finalists: expected an integer >= 1, got {self.finalists!r}")
        if not _is_int(self.rounds) or not _is_int(self.steps) or self.rounds < 1 or self.steps < 1:
            raise ValueError(f"rounds and steps: expected integers >= 1, got rounds={self.rounds!r}, "
                             f"steps={self.steps!r}")
        if self.confirm_rounds is not None and (not _is_int(self.confirm_rounds) or self.confirm_rounds < 1):
            raise ValueError(f"confirm_rounds: expected an integer >= 1, got {self.confirm_rounds!r}")

    def __repr__(self) -> str:
        """The options that differ from the defaults, on one line (cut short past 180 characters)."""
        changed = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self)
                            if getattr(self, f.name) != f.default)
        return f"OptimizeConfig({changed if len(changed) <= 160 else changed[:157] + '...'})"

    @property
    def confirmation_rounds(self) -> int:
        """The confirmation's rounds: ``confirm_rounds``, by default ``3 * rounds`` (two executables
        already compiled, so rounds cost only their steps)."""
        return 3 * self.rounds if self.confirm_rounds is None else self.confirm_rounds

    def limit_for(self, device_memory_bytes: int | None) -> int | None:
        """The memory limit in bytes per device that plans are held to on a cluster of
        ``device_memory_bytes`` (None: unknown): the lesser of it and :attr:`memory_limit`, None
        when neither is known."""
        known = [v for v in (self.memory_limit, device_memory_bytes) if v is not None]
        return min(known) if known else None

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The option names ``optimize`` accepts as keywords."""
        return tuple(f.name for f in dataclasses.fields(cls))
