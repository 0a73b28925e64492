"""The method plugin protocol: what a search method (MILO, SSR, eval, or one of your own)
supplies to the entry point and to the read side (results API, report, live status).

A method is one package that exposes one :class:`MethodPlugin`. The entry point builds
the method from ``cfg.method`` (Hydra), finds its plugin in the registry
(:mod:`milo_ray.methods`, keyed by the name the manifest records as ``method_name``) and
runs it through the plugin. The read side never switches on a method's class, config
keys or event kinds: it asks the run's plugin, through the value types here.

Write side: ``schema`` (the config dataclass), ``roles(config)`` (the agent roles the
configuration needs), ``preflight``, ``run(method, ctx)``, ``project(events)`` (the
method's state as a projection of its typed events).

Read side: ``status(spend)`` (a live :class:`StatusView` of the method's events),
``report_sections(res)`` (figures and tables), ``final_test(res)`` (a
:class:`FinalTestSpec`: which harnesses the run tested on which split, k, task ids and
the cache keys of the rollouts it used, as the run recorded them), ``summary_rows``,
``variant`` and ``incumbent`` (what a comparison row shows).

A run records its final test in its summary (``final_test_spec``, written by
:func:`final_test_record`); a run written before that (or one still running) has none,
and :meth:`MethodPlugin.final_test` falls back to rebuilding the benchmark's split from
the resolved config and deriving the keys, the rule every run of before followed.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterable, Mapping, Protocol, Sequence

from milo_ray.core.rollouts import cache_key
from milo_ray.core.seeds import final_test_seed
from milo_ray.search.events import Event, EventTypes

__all__ = ["Figure", "ReportTable", "ReportSection", "RoundMetrics", "StatusView", "TestedHarness", "FinalTestSpec",
           "MethodPlugin", "final_test_record", "recorded_tasks", "rebuilt_split", "SPEC_KEY"]

#: The summary key a method records its final test under (see :func:`final_test_record`).
SPEC_KEY = "final_test_spec"


# ---------------------------------------------------------------------------- report
@dataclass
class Figure:
    """A titled, captioned matplotlib figure; ``name`` is the file stem the report
    writes (``<out>/<name>.png`` and ``.svg``)."""

    name: str
    title: str
    caption: str
    fig: Any  # a matplotlib.figure.Figure built with the object API (Agg), never pyplot


@dataclass
class ReportTable:
    """A table of a method's report section: its HTML id, heading and DataFrame."""

    table_id: str
    heading: str
    frame: Any  # a pandas DataFrame, rendered as stored (formatting only)


@dataclass
class ReportSection:
    """One section of a run's report that a method contributes: its figures, then its
    tables, under ``title`` with a lead sentence. ``error``: why the method could not
    draw its section for this run (the page shows it)."""

    key: str  # the section's HTML id
    title: str
    lead: str
    figures: list[Figure] = field(default_factory=list)
    tables: list[ReportTable] = field(default_factory=list)
    error: str | None = None


# ---------------------------------------------------------------------------- live status
@dataclass
class RoundMetrics:
    """A closed round's numbers as a tracker logs them: ``step`` is the round (MILO's
    run-wide numbers use the count of rounds closed on any island, so their history is
    ordered), ``time`` the closing event's wall-clock time."""

    method: str
    step: int
    metrics: dict[str, float] = field(default_factory=dict)
    time: float | None = None


class StatusView(Protocol):
    """A method's live view of its own events (built by :meth:`MethodPlugin.status`)."""

    def observe(self, row: Mapping[str, Any]) -> list[RoundMetrics]:
        """Take one stored ``events`` row of the method; the rounds it closed."""
        ...

    def lines(self) -> list[str]:
        """One status line per island / race / unit of the method's work."""
        ...

    def headline(self) -> str | None:
        """The run line's "best so far" part (None: nothing known yet)."""
        ...

    def rounds_done(self) -> int | None:
        """Rounds every unit of work has closed (for the ETA against ``max_rounds``)."""
        ...


# ---------------------------------------------------------------------------- final test
@dataclass(frozen=True)
class TestedHarness:
    """One harness of a run's final test: its id, the label the summary gives it
    (None: none given, its name stands in), its ground-truth score, the island it was
    the best of (MILO; a seed sits on several)."""

    harness_id: str
    label: str | None = None
    true_score: float | None = None
    island: int | None = None


@dataclass(frozen=True)
class FinalTestSpec:
    """What a run's final test was. ``k``: rollouts per task (None: unknown, each
    harness's own rows count). ``task_ids``: the split's tasks (a task without a rollout
    scores 0); ``cache_keys``: the rollouts the test used, wherever they are stored (runs
    made before final tests drew fresh rollouts reused the search's on test tasks it had
    run). Both None when unknown: the rows stored under ``split`` stand in."""

    split: str
    k: int | None
    harnesses: tuple[TestedHarness, ...] = ()
    task_ids: tuple[str, ...] | None = None
    cache_keys: frozenset[str] | None = None
    #: The test tasks no search rollout ran (None: unknown, or the run is no search).
    held_out_task_ids: tuple[str, ...] | None = None


def final_test_record(split: str, k: int, task_ids: Sequence[str], results: Iterable[Any], *,
                      held_out: Sequence[str] | None = None) -> dict[str, Any]:
    """The summary entry (``summary[SPEC_KEY]``) recording a final test: its split, k,
    task ids, the cache keys of the rollouts it used (``results``: RolloutResults) and
    ``held_out_task_ids``, the test tasks the search never ran (None: not a search)."""
    keys = sorted({r.cache_key for r in results if getattr(r, "cache_key", "")})
    record = {"split": split, "k": int(k), "task_ids": list(task_ids), "cache_keys": keys}
    if held_out is not None:
        record["held_out_task_ids"] = list(held_out)
    return record


def _recorded(summary: Mapping[str, Any]) -> Mapping[str, Any] | None:
    spec = summary.get(SPEC_KEY)
    return spec if isinstance(spec, Mapping) and "cache_keys" in spec else None


def recorded_tasks(summary: Mapping[str, Any], split: str) -> list[str] | None:
    """The task ids of ``split`` the run's final test recorded (None: it recorded none)."""
    spec = _recorded(summary)
    return list(spec["task_ids"]) if spec and spec.get("split") == split else None


def rebuilt_split(res: Any, split: str) -> list[str] | None:
    """Task ids of one split of a run's benchmark, rebuilt from the resolved config
    (benchmarks draw their splits deterministically): the fallback for runs that did not
    record their final test. None, with a warning, when it cannot be built here (its data
    is elsewhere, a class is missing) or drew other splits than the run."""
    spec = res.config.get("benchmark")
    try:
        from hydra.utils import instantiate

        if not isinstance(spec, dict) or "_target_" not in spec:
            raise ValueError("the manifest's config has no benchmark._target_")
        tasks = [t.task_id for t in instantiate(spec, _convert_="all").tasks(split)]
    except Exception as e:  # any failure to rebuild it leaves the stored split labels
        why = f"cannot rebuild the benchmark ({type(e).__name__}: {(str(e).splitlines() or [''])[0]})"
    else:
        # A run made before splits were drawn in a fixed order, whose config listed them in
        # another order, drew other splits than its manifest (keys stored sorted) rebuilds:
        # a rebuilt list must hold every task stored under the split.
        stored = set(res.rollouts.loc[res.rollouts["split"] == split, "task_id"])
        if stored <= set(tasks):
            return tasks
        why = (f"the rebuilt benchmark's {split!r} split lacks tasks the run stored under it "
               f"(e.g. {sorted(stored - set(tasks))[0]!r}), so it drew other splits than the run")
    warnings.warn(f"{res.run_dir}: {why}; final-test metrics use the rollouts stored under split {split!r} "
                  "only (test tasks the search ran earlier are then missing)", stacklevel=5)
    return None


# ---------------------------------------------------------------------------- the protocol
class MethodPlugin:
    """Base of every method plugin; a method overrides what it has.

    ``name``: the key of the registry and the manifest's ``method_name``.
    ``method_class``: the class name of the method's ``_target_``, which recognizes
    manifests written before ``method_name`` was recorded. ``schema``: the config
    dataclass (registered in Hydra's ConfigStore). ``events``: the method's event kinds
    (None: the method keeps no typed events).
    """

    name: ClassVar[str] = ""
    #: False for a method that evaluates without searching (no held-out tasks to name).
    searches: ClassVar[bool] = True
    method_class: ClassVar[str] = ""
    schema: ClassVar[type | None] = None
    events: ClassVar[EventTypes | None] = None

    # ------------------------------------------------------------------ write side
    def roles(self, config: Mapping[str, Any]) -> tuple[str, ...]:
        """The agent roles (``backend.agents.<role>``) this method configuration needs."""
        return ()

    def preflight(self, method: Any, benchmark: Any, agents: Mapping[str, Any]) -> None:
        """Refuse (``ValueError``) a benchmark or backend the method cannot run on,
        before the run writes anything."""
        check = getattr(method, "preflight", None)
        if callable(check):
            check(benchmark, dict(agents))

    def run(self, method: Any, ctx: Any) -> dict[str, Any]:
        """Run the built method to its end; its JSON-able summary."""
        return method.run(ctx) or {}

    def project(self, events: Iterable[Event]) -> Any:
        """The method's state from its typed events, in write order (None: it keeps none)."""
        return None

    def owns_event(self, kind: str) -> bool:
        """Whether an ``events`` row of this kind is the method's."""
        return self.events is not None and self.events.owns(kind)

    def recognizes(self, manifest: Mapping[str, Any]) -> bool:
        """Whether a manifest without ``method_name`` is a run of this method (by the
        class name of its ``method`` target, the rule of runs written before)."""
        target = str(manifest.get("method") or "")
        return bool(self.method_class) and target.rsplit(".", 1)[-1] == self.method_class

    # ------------------------------------------------------------------ read side
    def status(self, spend: Callable[[], dict[str, float]]) -> StatusView | None:
        """A fresh live view of the method's events (None: the method shows no lines).
        ``spend``: the run-wide spend figures a closed round's metrics carry."""
        return None

    def report_sections(self, res: Any) -> list[ReportSection]:
        """The method's sections of the run report (``res``: a ``RunResults``)."""
        return []

    def summary_rows(self, summary: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        """The final-test leaderboard rows of a summary (``HarnessScore.as_dict()`` rows)."""
        return list(summary.get("final_test") or [])

    def test_setup(self, res: Any) -> tuple[str, int | None]:
        """The final test's split and rollouts per task from the run's resolved config
        (and summary): the fallback for runs that did not record them."""
        return "test", None

    def final_test(self, res: Any) -> FinalTestSpec:
        """The run's final test as the run recorded it (``summary[SPEC_KEY]`` and its
        leaderboard rows). Without a record (a run written before, or still running): the
        config's split and k, the split's tasks rebuilt from the benchmark config and the
        keys derived from them; with no leaderboard rows yet, every harness with rows
        stored under the split."""
        rows = self.summary_rows(res.summary)
        spec = _recorded(res.summary)
        split, k = (str(spec["split"]), int(spec["k"])) if spec else self.test_setup(res)
        if rows:
            tested = tuple(TestedHarness(str(r["harness_id"]), r.get("name"), r.get("true_score"), r.get("island"))
                           for r in rows)
        else:
            stored = res.rollouts.loc[res.rollouts["split"] == split, "harness_id"]
            tested = tuple(TestedHarness(str(h)) for h in dict.fromkeys(stored))
        if spec:
            tasks = tuple(spec["task_ids"])
            held = spec.get("held_out_task_ids")
            held = tuple(held) if held is not None and self.searches else self._held_out(res, tasks)
            return FinalTestSpec(split, k, tested, tasks, frozenset(spec["cache_keys"]), held)
        tasks = res.split_tasks(split)
        if tasks is None or k is None:
            return FinalTestSpec(split, k, tested)
        model, run_seed = res.manifest.get("model_id"), int(res.manifest.get("seed", 0))

        def keys_of(seed: int) -> frozenset[str]:
            return frozenset(cache_key(h.harness_id, t, i, model, seed) for h in tested for t in tasks for i in range(k))

        # The final test's own seed; runs made before it had one tested with the run seed.
        keys = keys_of(final_test_seed(run_seed))
        if not keys & set(res.rollouts["cache_key"]):
            keys = keys_of(run_seed)
        return FinalTestSpec(split, k, tested, tuple(tasks), keys, self._held_out(res, tuple(tasks)))

    def _held_out(self, res: Any, tasks: tuple[str, ...]) -> tuple[str, ...] | None:
        """The test tasks no search rollout ran: not among the tasks of the run's budgeted
        rollouts (the final test alone runs outside the budget; the write side's rule,
        :func:`milo_ray.search.final_test.searched_tasks`). None for a method that does
        not search."""
        if not self.searches:
            return None
        rows = res.rollouts
        if not len(rows):
            return tuple(tasks)
        budgeted = rows["budgeted"].fillna(True).astype(bool) if "budgeted" in rows else True
        searched = set(rows.loc[budgeted, "task_id"])
        return tuple(t for t in tasks if t not in searched)

    def variant(self, config: Mapping[str, Any]) -> str | None:
        """The named variant (e.g. an ablation rung) the method settings match, None when
        the method has none. Shown as ``rung`` by the comparison table."""
        return None

    def incumbent(self, final: Any) -> Any | None:
        """The row of the final-test frame a comparison shows for the run (None: none)."""
        return final.iloc[0] if len(final) else None
