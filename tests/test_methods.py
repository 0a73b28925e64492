"""A method registered here, and nowhere in milo_ray, gets everything the packaged methods
get: the entry point finds and preflights it through its plugin, and a run of it has live
status lines, a results summary (final test, comparison row, SQL runs view) and a report,
each read through the toy's own plugin (milo_ray/methods.py: the registry).

The toy names things unlike MILO, SSR and eval on purpose: its leaderboard is under
``leaderboard`` (not ``final_test``), its rollouts-per-test-task under ``method.reps`` (and it
has no fallback for runs that did not record their final test), its
events under ``toy.*``, its comparison row is its *second* leaderboard row, and its
benchmark cannot be rebuilt from the manifest (so only what the run recorded can give its
final test: a test task the search already ran is stored under ``search``)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import pandas as pd
import pytest

from milo_ray import methods, results
from milo_ray.context import RunContext
from milo_ray.core.rollouts import RolloutRequest, RolloutResult
from milo_ray.harness.model import Harness
from milo_ray.search.events import Event, EventLog, EventTypes
from milo_ray.search.final_test import FinalTest
from milo_ray.search.plugin import SPEC_KEY, Figure, MethodPlugin, ReportSection, ReportTable, RoundMetrics
from milo_ray.search.recording import HarnessRecorder
from milo_ray.store.parquet import ParquetRunStore, open_run
from milo_ray.tracking.status import RunStatus

MODEL = "toy-model"
SEARCH, TEST = ["t0", "t1", "t2"], ["t1", "t2", "t3"]  # t1, t2: the search ran them first


@dataclass(frozen=True)
class ToyStep(Event):
    kind: ClassVar[str] = "toy.step"
    column_fields: ClassVar[tuple[str, ...]] = ("round", "harness_id")
    round: int
    harness_id: str
    score: float


TOY_EVENTS = EventTypes("toy", (ToyStep,))


class Task:
    def __init__(self, task_id: str) -> None:
        self.task_id = task_id


class ToyBench:
    name = "toybench"

    def tasks(self, split: str) -> list[Task]:
        return [Task(t) for t in {"search": SEARCH, "test": TEST}[split]]

    def splits(self) -> dict[str, list[Task]]:
        return {s: self.tasks(s) for s in ("search", "test")}


def _score(harness_id: str, task_id: str, idx: int) -> float:
    # Deterministic and spread over [0, 1], so the metrics tell harnesses apart.
    return (sum(map(ord, harness_id + task_id)) + 3 * idx) % 5 / 4


class ToyScheduler:
    """Runs a request once per cache key and stores it, as the RolloutScheduler does."""

    def __init__(self, store: Any) -> None:
        self.store, self.cache, self.budget = store, {}, None

    def add_harness(self, h: Harness) -> None:
        pass

    def run(self, reqs: list[RolloutRequest], *, count_budget: bool = True) -> list[RolloutResult]:
        out, new = [], []
        for r in reqs:
            key = r.key(MODEL)
            if key not in self.cache:
                self.cache[key] = RolloutResult(r.harness_id, r.task_id, r.rollout_idx, _score(r.harness_id, r.task_id,
                                                r.rollout_idx), input_tokens=5, output_tokens=10, latency_s=1.0,
                                                split=r.split, method=r.method, round=r.round, cache_key=key,
                                                finished_at=time.time(), budgeted=count_budget)
                new.append(self.cache[key])
            out.append(self.cache[key])
        self.store.append_rollouts(new)
        return out


class ToyMethod:
    name = "toy"

    def __init__(self, steps: int = 3, reps: int = 2, **ignored: Any) -> None:
        self.steps, self.reps = steps, reps

    def preflight(self, benchmark: Any, agents: Any) -> None:
        if self.steps < 1:
            raise ValueError(f"method.steps={self.steps}: the toy needs at least one step")

    def run(self, ctx: RunContext) -> dict[str, Any]:
        log = EventLog(ctx.store, TOY_EVENTS)
        recorder = HarnessRecorder(ctx.store, resumed=False)
        found = []
        for i in range(self.steps):
            h = Harness.from_source(f"def build_agent(model, backend):\n    return {i}\n", name=f"v{i}")
            recorder.record(h, origin="seed" if i == 0 else "mutation", admitted=True, round=i)
            rows = ctx.scheduler.run([RolloutRequest(h.harness_id, t, 0, ctx.seed, split="search", method="toy",
                                                     round=i) for t in SEARCH])
            found.append((sum(r.score for r in rows) / len(rows), i, h))
            log.append(ToyStep(i, h.harness_id, found[-1][0]))
        best = max(found, key=lambda f: (f[0], -f[1]))[2]
        test = FinalTest(ctx.scheduler, ctx.benchmark, split="test", k=self.reps, seed=ctx.seed, method="toy")
        rows = test.rows([("toy first", found[0][2]), ("toy best", best)], round=self.steps)
        return {"method": "toy", "leaderboard": [r.as_dict() for r in rows], SPEC_KEY: test.record(),
                "stop_reason": "finished", "steps": self.steps}


class ToyStatus:
    def __init__(self, spend) -> None:
        self.spend, self.last, self.best = spend, None, None

    def observe(self, row):
        ev = TOY_EVENTS.decode_row(row)
        self.last, self.best = ev, max(ev.score, self.best if self.best is not None else ev.score)
        return [RoundMetrics("toy", ev.round, {"score": ev.score, **self.spend()}, row.get("time"))]

    def lines(self):
        return [] if self.last is None else [f"toy step {self.last.round}  score {self.last.score:.3f}"]

    def headline(self):
        return None if self.best is None else f"toy best {self.best:.3f}"

    def rounds_done(self):
        return None if self.last is None else self.last.round + 1


class ToyPlugin(MethodPlugin):
    name = "toy"
    method_class = "ToyMethod"
    events = TOY_EVENTS

    def status(self, spend):
        return ToyStatus(spend)

    def report_sections(self, res):
        from matplotlib.figure import Figure as MplFigure

        steps = TOY_EVENTS.decode_rows(res.event_rows())
        fig = MplFigure(figsize=(4, 3))
        fig.subplots().plot([e.round for e in steps], [e.score for e in steps])
        frame = pd.DataFrame([{"round": e.round, "harness_id": e.harness_id, "score": e.score} for e in steps])
        return [ReportSection("toy-figures", "Toy search", "Search score per step.",
                              [Figure("toy_scores", "Toy: score per step", "Mean search score.", fig)],
                              [ReportTable("toy-steps-table", "Steps", frame)])]

    def summary_rows(self, summary):
        return list(summary.get("leaderboard") or [])

    def variant(self, config):
        return f"toy-{(config.get('method') or {}).get('steps')}"

    def incumbent(self, final):
        best = final[final["label"] == "toy best"]
        return best.iloc[0] if len(best) else None


@pytest.fixture(scope="module")
def toy():
    plugin = methods.register(ToyPlugin())
    yield plugin
    methods.unregister("toy")


@pytest.fixture(scope="module")
def toy_run(toy, tmp_path_factory):
    """A toy run written as the entry point writes one: the method built, dispatched
    through its plugin, a live status on the store, the manifest with ``method_name``."""
    run_dir = tmp_path_factory.mktemp("toy") / "run"
    method = ToyMethod(steps=3, reps=2)
    plugin = methods.plugin_for_method(method)
    bench = ToyBench()
    plugin.preflight(method, bench, {})
    store = ParquetRunStore(run_dir, run_id="toy-1")
    config = {"method": {"_target_": f"{__name__}.ToyMethod", "steps": 3, "reps": 2},
              "benchmark": {"_target_": "not.importable.ToyBench"}}
    manifest = {"run_id": "toy-1", "status": "running", "config": config, "seed": 0, "model_id": MODEL,
                "method": config["method"]["_target_"], "method_name": plugin.name,
                "benchmark": "not.importable.ToyBench", "started_at": time.time(),
                "history": [{"started_at": time.time()}]}
    store.write_manifest(manifest)
    live, closed = RunStatus(method=plugin), []
    live.subscribe(closed.append)
    store.add_listener(live.observe)
    ctx = RunContext(run_id="toy-1", run_dir=run_dir, seed=0, store=store, benchmark=bench,
                     scheduler=ToyScheduler(store), model_id=MODEL)
    summary = plugin.run(method, ctx)
    now = time.time()
    store.write_manifest({**manifest, "status": "finished", "summary": summary, "finished_at": now,
                          "history": [{**manifest["history"][0], "finished_at": now, "status": "finished"}]})
    store.flush()
    store.close()
    return run_dir, summary, live, closed


def test_the_entry_point_finds_preflights_and_refuses_through_the_plugin(toy):
    from milo_ray.config.errors import UserError
    from milo_ray.run import _method_plugin

    assert _method_plugin(ToyMethod()) is toy
    with pytest.raises(ValueError, match="method.steps=0"):
        toy.preflight(ToyMethod(steps=0), ToyBench(), {})

    class Nameless:
        name = "nameless"

    with pytest.raises(UserError, match=r"method._target_: .*Nameless.*has no method plugin"):
        _method_plugin(Nameless())


def test_a_toy_run_has_live_status_lines_and_round_metrics(toy_run):
    run_dir, summary, live, closed = toy_run
    stored = sorted((r for r in open_run(run_dir).read("events").to_pylist() if r["kind"] == "toy.step"),
                    key=lambda r: r["seq"])
    scores = [json.loads(r["payload"])["score"] for r in stored]
    assert [m.step for m in closed] == [0, 1, 2] and [m.metrics["score"] for m in closed] == scores
    lines = live.lines()
    assert lines[0] == f"toy step 2  score {scores[-1]:.3f}"
    assert lines[1].startswith(f"run  toy best {max(scores):.3f}  spend ")
    # A status without a method finds the toy's plugin by its events (through the registry).
    again = RunStatus()
    again.replay(open_run(run_dir))
    assert again.method == "toy" and again.lines()[0] == lines[0]


def test_the_results_summary_is_the_toy_plugins(toy_run):
    run_dir, summary, _, _ = toy_run
    res = results.load_run(run_dir)
    assert res.method == "toy" and res.plugin.name == "toy" and res.rung == "toy-3"
    final = results.final_test(res)
    assert list(final["label"]) == ["toy first", "toy best"]
    for row, recorded in zip(final.to_dict("records"), summary["leaderboard"]):
        # Every test task, both rollouts: the search's rows of t1/t2 (stored under "search")
        # are found by the recorded cache keys; the benchmark cannot be rebuilt here.
        assert (row["n_tasks"], row["k"], row["n_rollouts"]) == (3, 2, 6)
        assert row["pr_at_k"] == pytest.approx(recorded["pr_at_k"])
        assert row["pass_at_k"] == pytest.approx(recorded["pass_at_k"])
    assert res.split_tasks("test") == TEST
    row = results.compare([res]).iloc[0]
    assert (row["method"], row["rung"], row["label"], row["stop_reason"]) == ("toy", "toy-3", "toy best", "finished")
    con = results.connect(run_dir)
    assert con.execute("select method, rung from runs").fetchall() == [("toy", "toy-3")]


def test_a_toy_run_renders_a_report_with_the_toys_section(toy_run, tmp_path):
    from milo_ray.report import write_report

    run_dir, _, _, _ = toy_run
    page = write_report(run_dir, tmp_path).read_text("utf-8")
    assert 'id="toy-figures"' in page and "Toy search" in page and "Toy: score per step" in page
    assert 'id="toy-steps-table"' in page
    assert (tmp_path / "toy_scores.png").is_file() and (tmp_path / "toy_scores.svg").is_file()
    assert "toy best" in page.split('id="final-test-table"', 1)[1].split("</table>", 1)[0]
    assert "no method-specific events" not in page
