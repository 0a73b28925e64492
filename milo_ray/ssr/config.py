"""SSR's structured config (registered by the entry point as ``method/ssr_schema``).

Every field is implemented by ``milo_ray.ssr.loop.SSRMethod``; defaults are the
paper's main SWE-Pro-V configuration (papers/002 App. 10, DESIGN §4.3). The budget B
is the run-level ``run.budget.executions``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Optional

from milo_ray.search.strategy import check_choices, choice_field, resolve_field
from milo_ray.ssr.racing import RACING_RULES, RacingRule
from milo_ray.ssr.strategies import EVIDENCE_SETS, ORDERINGS, EvidenceOrdering, EvidenceSets
from milo_ray.ssr.task_draw import TASK_DRAWS, TaskDraw


@dataclass
class SSRConfig:
    """Successive Scale Racing.

    initial: name of the benchmark seed harness to start from (empty: the first seed).
    train_split / val_split / test_split: benchmark split names (evidence / racing
        validation / final test); train_split None takes the benchmark's ``train``
        split, or ``search`` where it has none.
    scales: evidence fractions α; candidate i gets the ⌈α_i·N⌉ best-ranked records.
        Their count is the number of children M for every evidence strategy.
    evidence: the evidence-set strategy (:class:`~milo_ray.ssr.strategies.EvidenceSets`):
        ``rer`` (nested multiscale prefixes), ``topk_fixed`` (every child gets the same
        top ⌈scales[0]·N⌉ records), ``topk_resampling`` (each child an independent
        uniform subset of that size), ``fixed_n`` (every child gets all N records).
    ordering: the evidence ordering (:class:`~milo_ray.ssr.strategies.EvidenceOrdering`):
        ``rer`` (submodular quality+coverage greedy), ``random`` (uniform permutation),
        ``quality_only`` (sort by q = a·u) — used for every prefix.
    racing: the racing rule (:class:`~milo_ray.ssr.racing.RacingRule`):
        ``successive_halving`` (the paper's: keep n_r = M − round(r·M/K) after
        intermediate stages), ``halving`` (keep ⌈M/2^r⌉: the K-stage halving schedule,
        e.g. stages=4 for M=12), ``paired`` (drop children significantly worse than the
        leader on paired per-task differences, stop at one survivor; set stages to the
        number of task blocks, b_v to the block size; alpha and min_tasks via
        ``{_target_: milo_ray.ssr.racing.PairedElimination, alpha: 0.05}``) or
        ``uniform`` (same batches, no elimination).
    Each of these three also takes a ``{_target_: ...}`` building another object of its
    protocol; events and the summary record the object's ``name``.
    task_draw: how a race draws its tasks (:mod:`~milo_ray.ssr.task_draw`): ``uniform``
        (the paper's: validation tasks uniformly without replacement, training classes in
        RER order) or ``discriminative`` (tasks the current population passes at an
        intermediate rate first, from the population's recorded executions: the current
        parent and the harnesses of the last race; refreshed every round). The test
        split is never drawn from. Takes a ``{_target_: ...}`` too, e.g.
        ``{_target_: milo_ray.ssr.task_draw.DiscriminativeDraw, band: [0.3, 0.7]}``.
    stages: K, the racing stages per round.
    b_v: validation tasks per stage (one entry per stage, or one for all).
    b_s / b_f: parent-success / parent-failure training tasks per stage;
    rollouts: R executions per (harness, task) in racing.
    replace_alpha: the parent-replacement gate (None: off, the paper's rule): a child
        replaces the parent only if its paired per-task advantage over the parent is
        significant at this one-sided level, besides being strictly higher.
    patience: P consecutive rounds without strict improvement stop the run.
    candidate_cap: cap on the total number of children generated over the run (None:
        only budget, deadline and patience stop it).
    test_rollouts: evaluations per test task of the initial and final harness
        (outside the budget).
    evaluate_initial: also test the initial harness (the summary reports both).
    judge_retries: re-asks of a judge whose answer is malformed or out of range
        before the record is stored as a judge failure (excluded from ranking).
    judge_workers: concurrent judge calls (threads; judge calls are I/O-bound).
    validate_timeout_s: time limit of a candidate's validation subprocess.
    max_concurrent_candidates: children generated at once (Ray tasks).
    optimizer_time_cap_s: cap of one optimizer call (45 min, as MILO's mutations); past it
        the call is stopped and the candidate recorded as failed with the reason.
    duplicate_retries: times a child identical to the parent or to an earlier
        candidate of the round is re-drawn with a fresh seed before it is dropped (the
        optimizer may write the same edit twice when given the same evidence, as under
        ``topk_fixed`` and ``fixed_n``); 0 drops duplicates at once.
    """

    _target_: str = "milo_ray.ssr.loop.SSRMethod"
    initial: str = ""
    train_split: Optional[str] = None
    val_split: str = "val"
    test_split: str = "test"
    scales: list[float] = field(default_factory=lambda: [0.25, 0.5, 0.75, 1.0])
    # The allowed values of these three are declared by their choices.
    evidence: Any = choice_field(EVIDENCE_SETS, "rer")
    ordering: Any = choice_field(ORDERINGS, "rer")
    racing: Any = choice_field(RACING_RULES, "successive_halving")
    task_draw: Any = choice_field(TASK_DRAWS, "uniform")
    stages: int = 2
    b_v: list[int] = field(default_factory=lambda: [10, 10])
    b_s: int = 5
    b_f: int = 5
    rollouts: int = 2
    replace_alpha: Optional[float] = None
    patience: int = 2
    candidate_cap: Optional[int] = None
    test_rollouts: int = 3
    evaluate_initial: bool = True
    judge_retries: int = 2
    judge_workers: int = 8
    validate_timeout_s: float = 60.0
    max_concurrent_candidates: int = 4
    optimizer_time_cap_s: float = 2700.0
    duplicate_retries: int = 2

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> "SSRConfig":
        """Raise ``ValueError`` naming the field and the fix on a bad value."""
        check_choices(self, prefix="method")
        scales = [float(a) for a in self.scales]
        if not scales or any(not 0 < a <= 1 for a in scales) or scales != sorted(scales):
            raise ValueError(f"method.scales={list(self.scales)}; give increasing fractions in (0, 1], e.g. [0.25,0.5,0.75,1.0]")
        for name in ("stages", "rollouts", "patience", "test_rollouts", "judge_workers", "max_concurrent_candidates"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"method.{name} must be >= 1, got {getattr(self, name)}")
        b_v = list(self.b_v) if not isinstance(self.b_v, int) else [self.b_v]
        if len(b_v) not in (1, self.stages):
            raise ValueError(f"method.b_v={b_v}; give one entry per stage (stages={self.stages}) or a single number")
        for name in ("b_s", "b_f", "judge_retries", "duplicate_retries"):
            if int(getattr(self, name)) < 0:
                raise ValueError(f"method.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("optimizer_time_cap_s", "validate_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"method.{name} must be > 0 seconds, got {getattr(self, name)}")
        if self.replace_alpha is not None and not 0.0 < float(self.replace_alpha) < 0.5:
            raise ValueError(f"method.replace_alpha must be in (0, 0.5) or null (off), got {self.replace_alpha}")
        if self.candidate_cap is not None and self.candidate_cap < 1:
            raise ValueError(f"method.candidate_cap must be >= 1 or null, got {self.candidate_cap}")
        return self

    def for_run(self, benchmark: Any, agents: dict[str, Any]) -> "SSRConfig":
        """This config checked against the run's benchmark and backend, its splits
        resolved; ``ValueError`` names the field and the fix (the entry point calls it
        before a run writes anything)."""
        from milo_ray.benchmarks.base import resolve_split

        missing = [k for k in ("judge", "optimizer", "embedder") if agents.get(k) is None]
        if missing:
            raise ValueError(f"backend.agents: SSR needs {missing}; the backend config must define judge, "
                             "optimizer and embedder")
        return replace(
            self,
            train_split=resolve_split(benchmark, self.train_split, field="method.train_split",
                                      fallbacks=("train", "search")),
            val_split=resolve_split(benchmark, self.val_split, field="method.val_split"),
            test_split=resolve_split(benchmark, self.test_split, field="method.test_split"),
        )

    @cached_property
    def evidence_strategy(self) -> EvidenceSets:
        """The object ``evidence`` names."""
        return resolve_field(self, "evidence", prefix="method")

    @cached_property
    def ordering_strategy(self) -> EvidenceOrdering:
        """The object ``ordering`` names."""
        return resolve_field(self, "ordering", prefix="method")

    @cached_property
    def racing_strategy(self) -> RacingRule:
        """The object ``racing`` names."""
        return resolve_field(self, "racing", prefix="method")

    @cached_property
    def task_draw_strategy(self) -> TaskDraw:
        """The object ``task_draw`` names."""
        return resolve_field(self, "task_draw", prefix="method")

    @property
    def m(self) -> int:
        return len(self.scales)
