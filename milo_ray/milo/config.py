"""MILO's method config (registered by the entry point as ``milo_schema``).

Every field is read by :class:`milo_ray.milo.loop.MiloMethod`; defaults follow the
paper (papers/000 §4, App. A.1). The A.5 ablation ladder is expressed with
``mutator_mode``, ``memory``, ``parent_selection``, ``num_islands`` and
``orchestrator`` (see ``conf/method/milo_A.yaml`` … ``milo_E.yaml``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, List, Optional

from milo_ray.milo.strategies import MEMORIES, MUTATOR_MODES, PARENT_SELECTIONS, MemoryRendering, ParentSelection
from milo_ray.search.strategy import check_choices, choice_field, resolve_field

# ``default_mutator`` value meaning "the first spec of the backend's pool" (App. A.1:
# every island starts with the pool's first agent; the orchestrator may reassign).
FIRST_SPEC = "first"
# The three expert-designed seeds every search in papers/000 starts from (B10-B12).
EXPERT_SEEDS: tuple[str, ...] = ("division_of_labor", "plan_and_solve", "reproduce_first")


@dataclass
class MiloConfig:
    """MILO search settings.

    num_islands: K, islands seeded by the K most behavior-dissimilar seeds; with K=1
        every seed starts in the single population (the A.5 baselines).
    patience: P, rounds without a new held-out best before the orchestrator is called.
    temperature: T of the parent-selection softmax over eta.
    eps: tolerance of the accuracy tie band in dominance.
    k_search / k_val / k_test: rollouts per task on B_search, B_val, and the final test
        evaluation (the leaderboard k).
    token_cap / seconds_cap: per-task cost caps c_i of the fitness economy axes.
    max_moves: most orchestrator moves per intervention.
    island_concurrency: concurrent rollouts per island (scheduler group limit).
    seeds: names of the benchmark's seed harnesses the run starts from, in this order
        (the K most behavior-dissimilar of them found the islands). Default: the three
        expert seeds every search of papers/000 starts from (division_of_labor,
        plan_and_solve, reproduce_first = B10-B12); an empty list: every seed the
        benchmark offers. An unknown name is refused before the run writes anything.
    pool_size: use the first N mutator specs of the backend's pool (None: all of them;
        more than the pool holds is refused).
    default_mutator: m^(1), every island's initial mutator: ``"first"`` = the first spec
        of the (pool_size-limited) pool on every island, as the paper's experiments run
        (App. A.1: every island starts with the pool's first agent); a spec name = that
        spec on every island; None = a uniform random spec per island (§4.1.2's rule).
    mutation_time_cap_s: cap of one mutation or graft (timeout -> rejected child).
    mutator_concurrency: concurrent mutations per mutator spec in this run, for a spec
        that declares no ``seats`` (a spec's ``seats`` is its account's limit, shared by
        every run on the cluster: see :mod:`milo_ray.milo.mutator_pool`).
    mutation_num_cpus: CPUs reserved by each mutation's Ray task.
    max_rounds: stop an island after this many rounds (None: until time or budget).
    max_idle_rounds: stop an island once this many rounds in a row evaluated no new child
        (every child a duplicate of a harness already evaluated, or invalid): such rounds
        spend no execution, so without this a run whose mutators reach nothing new never
        gets to its budget (None: never; the run stops when every island has stopped).
    search_size / val_size: tasks in B_search / B_val drawn (with the run seed) from the
        benchmark's search / val split (None: the whole split); the rest of the search
        split is the pool a curriculum revision may draw from.
    search_split / val_split / test_split: the benchmark's split names; search_split
        None takes the benchmark's ``search`` split, or ``train`` where it has none.
    mutator_mode: "agentic" (the mutator reads the parent's evidence dir and the memory)
        or "one_shot" (parent source and aggregate score only; passed to the mutator as
        ``context['mode']``).
    memory: how the island's memory is rendered for its mutator (a
        :class:`~milo_ray.milo.strategies.MemoryRendering`): "lineage" (indented tree with
        verdicts, diffs and the needle ranking), "flat" (admitted harnesses and scores
        only), or a ``{_target_: ...}`` building another rendering.
    parent_selection: how a round's parent is chosen (a
        :class:`~milo_ray.milo.strategies.ParentSelection`): "softmax" (eta/T), "best"
        (highest search accuracy), or a ``{_target_: ...}`` building another selection.
    orchestrator: call the orchestrator on stalls (False: stalls are only recorded).
    round_sync: islands advance in lock-step rounds: every island runs round r, then the
        orchestrator may intervene, then round r+1 (Algorithm 1's round structure; fully
        reproducible). False: free-running islands, each starting its next round as soon
        as its last one closed (an island never waits for a slower one; faster on
        uneven mutation times, not reproducible from the seed alone).
    validate_timeout_s: timeout of a child's validation subprocess.
    final_candidates: evaluate this many best harnesses (by held-out score, one per
        island first) on the test split.
    """

    _target_: str = "milo_ray.milo.loop.MiloMethod"
    num_islands: int = 3
    patience: int = 3
    temperature: float = 1.0
    eps: float = 0.02
    k_search: int = 3
    k_val: int = 3
    k_test: int = 5
    token_cap: float = 20_000_000
    seconds_cap: float = 7_200
    max_moves: int = 2
    island_concurrency: int = 8
    seeds: List[str] = field(default_factory=lambda: list(EXPERT_SEEDS))
    pool_size: Optional[int] = None
    default_mutator: Optional[str] = FIRST_SPEC
    mutation_time_cap_s: float = 2_700
    mutator_concurrency: int = 8
    mutation_num_cpus: float = 0.25
    max_rounds: Optional[int] = None
    max_idle_rounds: Optional[int] = 50
    search_size: Optional[int] = None
    val_size: Optional[int] = None
    search_split: Optional[str] = None
    val_split: str = "val"
    test_split: str = "test"
    # The allowed values of these three are declared by their choices (milo/strategies.py).
    mutator_mode: str = choice_field(MUTATOR_MODES, "agentic")
    memory: Any = choice_field(MEMORIES, "lineage")
    parent_selection: Any = choice_field(PARENT_SELECTIONS, "softmax")
    orchestrator: bool = True
    round_sync: bool = True
    validate_timeout_s: float = 60.0
    final_candidates: int = 1

    def check(self) -> None:
        """Reject values the loop cannot honour, naming the field."""
        def bad(field: str, why: str) -> None:
            raise ValueError(f"method.{field}={getattr(self, field)!r}: {why}")

        for f in ("num_islands", "patience", "k_search", "k_val", "k_test", "island_concurrency", "pool_size",
                  "mutator_concurrency", "final_candidates"):
            if getattr(self, f) is not None and int(getattr(self, f)) < 1:
                bad(f, "must be >= 1")
        if self.max_moves < 0:
            bad("max_moves", "must be >= 0")
        if self.temperature <= 0:
            bad("temperature", "must be > 0")
        if not 0 <= self.eps < 1:
            bad("eps", "must be in [0, 1)")
        for f in ("token_cap", "seconds_cap", "mutation_time_cap_s", "validate_timeout_s"):
            if not getattr(self, f) > 0:
                bad(f, "must be > 0")
        if self.mutation_num_cpus < 0:
            bad("mutation_num_cpus", "must be >= 0 (CPUs reserved by each mutation's Ray task)")
        check_choices(self, prefix="method")
        if self.max_rounds is not None and self.max_rounds < 0:
            bad("max_rounds", "must be >= 0 or null")
        if self.max_idle_rounds is not None and self.max_idle_rounds < 1:
            bad("max_idle_rounds", "must be >= 1 or null (never)")
        for f in ("search_size", "val_size"):
            if getattr(self, f) is not None and getattr(self, f) < 1:
                bad(f, "must be >= 1 or null")
        if isinstance(self.seeds, str) or not all(isinstance(x, str) and x for x in self.seeds):
            bad("seeds", "expected a list of seed harness names ([] for all of the benchmark's seeds)")
        if len(set(self.seeds)) != len(self.seeds):
            bad("seeds", "names a seed more than once")

    @cached_property
    def parent_selection_strategy(self) -> ParentSelection:
        """The object ``parent_selection`` names."""
        return resolve_field(self, "parent_selection", prefix="method")

    @cached_property
    def memory_strategy(self) -> MemoryRendering:
        """The object ``memory`` names."""
        return resolve_field(self, "memory", prefix="method")

    def for_run(self, benchmark: Any, agents: dict[str, Any]) -> "MiloConfig":
        """This config checked against the run's benchmark and backend, its splits
        resolved; ``ValueError`` names the field and the fix (the entry point calls it
        before a run writes anything)."""
        from milo_ray.benchmarks.base import resolve_split

        resolved = replace(
            self,
            search_split=resolve_split(benchmark, self.search_split, field="method.search_split",
                                       fallbacks=("search", "train")),
            val_split=resolve_split(benchmark, self.val_split, field="method.val_split"),
            test_split=resolve_split(benchmark, self.test_split, field="method.test_split"),
        )
        pool = list(agents.get("mutators") or [])
        if not pool:
            raise ValueError("backend.agents.mutators: MILO needs at least one mutator spec in the backend's pool")
        if self.pool_size is not None and self.pool_size > len(pool):
            raise ValueError(f"method.pool_size={self.pool_size}: the backend's pool has {len(pool)} mutator specs; "
                             f"set method.pool_size <= {len(pool)} or null (the whole pool)")
        if self.orchestrator and self.max_moves > 0 and not agents.get("orchestrator"):
            raise ValueError("method.orchestrator=true but backend.agents.orchestrator is not set; "
                             "set one or pass method.orchestrator=false")
        from milo_ray.milo.mutator_pool import seats_of, spec_names

        names = spec_names(pool[: self.pool_size])
        for i, spec in enumerate(pool[: self.pool_size]):
            seats_of(spec, i)
        if self.default_mutator == FIRST_SPEC:
            if FIRST_SPEC in names[1:]:
                raise ValueError(f"method.default_mutator={FIRST_SPEC!r} is ambiguous: the pool {names} has a spec "
                                 f"named {FIRST_SPEC!r} that is not its first; name the spec you mean")
            resolved = replace(resolved, default_mutator=names[0])
        elif self.default_mutator is not None and self.default_mutator not in names:
            raise ValueError(f"method.default_mutator={self.default_mutator!r}: not in the pool {names} "
                             f"(or {FIRST_SPEC!r} for its first spec, null for a random spec per island)")
        self.seed_harnesses(benchmark)
        return resolved

    def seed_harnesses(self, benchmark: Any) -> list[Any]:
        """The seed harnesses this run starts from (``seeds`` in order; all when empty);
        ``ValueError`` names ``method.seeds`` and the benchmark's seeds when one is unknown."""
        offered = list(benchmark.seed_harnesses())
        by_name = {h.name: h for h in offered}
        if not self.seeds:
            if not offered:
                raise ValueError(f"benchmark {getattr(benchmark, 'name', '?')}: no seed harnesses")
            return offered
        unknown = [s for s in self.seeds if s not in by_name]
        if unknown:
            raise ValueError(f"method.seeds: unknown seed harness(es) {unknown}; benchmark "
                             f"{getattr(benchmark, 'name', '?')} offers {sorted(by_name)} ([] for all of them)")
        return [by_name[s] for s in self.seeds]
