"""The MILO loop end to end on a small slice of the surrogate, through the real
scheduler and Ray, with a scripted orchestrator so each move is exercised."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest

from milo_fakes import SCRIPTS, ScriptedOrchestrator
from milo_ray.milo.config import EXPERT_SEEDS
from milo_ray.milo.island import Island

MUTATORS = [
    {"_target_": "milo_ray.agents.mutators.offline.OfflineMutator", "personality": p}
    for p in ("conservative", "bold", "sloppy")
]


def make_ctx(tmp_path: Path, *, budget: int | None = None, seed: int = 0, orchestrator=None):
    from milo_ray.benchmarks.surrogate import SurrogateBenchmark
    from milo_ray.context import RunContext
    from milo_ray.execution.budget import BudgetLedger
    from milo_ray.execution.scheduler import RolloutScheduler
    from milo_ray.store.memory import MemoryRunStore

    bench = SurrogateBenchmark(preset="surrogate_tb21", seed=seed)
    store = MemoryRunStore(run_id=f"t{seed}")
    tasks = {t.task_id: t for s in bench.splits().values() for t in s}
    sched = RolloutScheduler(executor_config=bench.executor_config(), tasks=tasks, store=store,
                             model_id="offline-surrogate", run_id=store.run_id, budget=BudgetLedger(executions=budget))
    agents = {"mutators": MUTATORS, "orchestrator": orchestrator}
    return RunContext(run_id=store.run_id, run_dir=tmp_path, seed=seed, store=store, benchmark=bench, scheduler=sched,
                      model_id="offline-surrogate", agents=agents)


PATIENCE = 1  # P of the scripted run: every round without a held-out gain stalls an island
SMALL = dict(k_search=1, k_val=1, k_test=1, search_size=8, val_size=6, round_sync=True, default_mutator="conservative")


def events(store, kind=None):
    rows = sorted(store.read("events").to_pylist(), key=lambda r: r["seq"])
    out = []
    for r in rows:
        if kind is None or r["kind"] == kind:
            p = r["payload"]
            out.append({**r, "payload": json.loads(p) if isinstance(p, str) else p})
    return out


def _first_nonroot(state):
    j = state["trigger"]
    isl = next(s for s in state["islands"] if s["island"] == j)
    for n in isl["nodes"]:
        if not n["is_root"]:
            return {"diagnosis": "niche", "speciate": [{"from_island": j, "harness_id": n["node_id"], "mutator": "bold"}]}
    return {"diagnosis": "nothing to speciate yet", "reassign": [{"island": j, "mutator": "sloppy" if state["assignment"][str(j)] != "sloppy" else "bold"}]}


def _toggle(state):
    j = state["trigger"]
    cur = state["assignment"][str(j)]
    return {"diagnosis": "dry", "reassign": [{"island": j, "mutator": "sloppy" if cur != "sloppy" else "conservative"}]}


def _curriculum(state):
    pool = [t for t in state["task_pool"] if t not in state["search_tasks"]][:4] + state["search_tasks"][:4]
    return {"diagnosis": "plateau", "curriculum": {"tasks": pool}}


SCRIPT = [
    {"diagnosis": "dry", "reassign": [{"island": 0, "mutator": "bold"}]},
    lambda st: {"diagnosis": "exhausted", "recombine": [{"dest_island": st["trigger"], "donor_island": 1 - st["trigger"]}]},
    _curriculum,
    _first_nonroot,
    _toggle,  # repeated for every later call
]


class ScriptedRun(NamedTuple):
    ctx: Any
    summary: dict[str, Any]
    calls: list[dict[str, Any]]  # what the scripted orchestrator was called with, in call order


ISLAND_ACTORS: dict[str, int] = {}  # run -> island actors it started


def _island_actors() -> set[str]:
    """Ids of the island actors this Ray job has started so far (alive or not)."""
    import ray
    from ray._private import state

    job = ray.get_runtime_context().get_job_id()
    return {a["ActorID"] for a in state.actors().values() if a["ActorClassName"] == "Island" and a["JobID"] == job}


@pytest.fixture(scope="module")
def scripted(ray_local, tmp_path_factory) -> ScriptedRun:
    from milo_ray.milo.loop import MiloMethod

    tmp = tmp_path_factory.mktemp("milo_scripted")
    # A fresh list bound for this run: the orchestrator appends every call to it, and a
    # later module resetting ScriptedOrchestrator.calls cannot change what this run saw.
    calls = ScriptedOrchestrator.calls = []
    SCRIPTS["moves"] = SCRIPT
    orch = {"_target_": "milo_fakes.ScriptedOrchestrator", "script": "moves"}
    ctx = make_ctx(tmp, orchestrator=orch)
    before = _island_actors()
    summary = MiloMethod(num_islands=2, patience=PATIENCE, max_rounds=4, **SMALL).run(ctx)
    ISLAND_ACTORS["scripted"] = len(_island_actors() - before)
    yield ScriptedRun(ctx, summary, calls)
    # Its rollout workers hold the session's CPUs until they idle out: free them for the
    # next in-process run (as run.py does at the end of every run).
    ctx.scheduler.close()


@pytest.fixture(scope="module")
def scripted_run(scripted):
    return scripted.ctx, scripted.summary


def test_forced_stall_triggers_a_diagnosis(scripted_run):
    ctx, summary = scripted_run
    decisions = events(ctx.store, "milo.decision")
    assert decisions, "P=1 must call the orchestrator"
    # A decision follows a round whose stall reached P on its trigger island.
    progress = events(ctx.store, "milo.progress")
    first = decisions[0]
    trig = first["payload"]["trigger"]
    before = [e for e in progress if e["seq"] < first["seq"] and e["payload"]["island"] == trig]
    assert before[-1]["payload"]["stall"] >= 1
    assert summary["interventions"] == len(decisions)


def test_reassign_changes_the_mutator_used_next_round(scripted_run):
    ctx, _ = scripted_run
    re = events(ctx.store, "milo.reassign")
    assert re and re[0]["payload"] == {"island": 0, "mutator": "bold", "decision_id": re[0]["payload"]["decision_id"]}
    later = [e["payload"]["node"] for e in events(ctx.store, "milo.node")
             if e["seq"] > re[0]["seq"] and e["payload"]["node"]["island"] == 0
             and e["payload"]["node"]["origin"] == "mutation"]
    assert later and later[0]["mutator"] == "bold"
    earlier = [e["payload"]["node"] for e in events(ctx.store, "milo.node")
               if e["seq"] < re[0]["seq"] and e["payload"]["node"]["island"] == 0
               and e["payload"]["node"]["origin"] == "mutation"]
    assert all(n["mutator"] == "conservative" for n in earlier)


def test_every_verdict_follows_the_admission_rule(scripted_run):
    """Replaying the node stream, each child's recorded verdict (graft children included)
    equals Adm(child) against the island's admitted set at that moment."""
    ctx, _ = scripted_run
    islands: dict[int, Island] = {}
    graft_seen = False
    for e in events(ctx.store):
        p = e["payload"]
        if e["kind"] == "milo.island":
            moved = islands[p["from_island"]].detach_subtree(p["node_id"])
            islands[p["island"]] = Island(p["island"])
            islands[p["island"]].adopt_subtree(moved)
        elif e["kind"] == "milo.refit":
            islands[p["island"]].relabel(p["node_id"], p["changes"])
        elif e["kind"] == "milo.node":
            n = p["node"]
            isl = islands.setdefault(n["island"], Island(n["island"]))
            if n["origin"] in ("mutation", "graft") and n["fitness"] is not None:
                assert isl.judge(n["fitness"]).admitted == n["admitted"], n["node_id"]
                graft_seen |= n["origin"] == "graft"
            isl.add_node(n)
    assert graft_seen, "the scripted Graft must produce an evaluated child"


def test_graft_child_has_co_parent_from_donor(scripted_run):
    ctx, _ = scripted_run
    grafts = [e["payload"]["node"] for e in events(ctx.store, "milo.node") if e["payload"]["node"]["origin"] == "graft"]
    assert grafts
    g = grafts[0]
    assert g["co_parent"] and g["parent"] and g["mutator"] == "orchestrator"
    rows = [r for r in ctx.store.read("harnesses").to_pylist() if r["origin"] == "graft"]
    assert rows[0]["co_parent_id"]


def test_curriculum_changes_b_search_and_refits_admitted(scripted_run):
    ctx, _ = scripted_run
    cur = events(ctx.store, "milo.curriculum")
    assert cur
    new_tasks = cur[0]["payload"]["tasks"]
    refits = [e for e in events(ctx.store, "milo.refit") if e["seq"] > cur[0]["seq"]]
    assert refits
    for e in refits:
        assert sorted(e["payload"]["changes"]["behavior"]) == sorted(new_tasks)
    # Admitted harnesses at the time of the change were all re-fit.
    admitted_before = {e["payload"]["node"]["node_id"] for e in events(ctx.store, "milo.node")
                       if e["seq"] < cur[0]["seq"] and e["payload"]["node"]["admitted"]}
    assert admitted_before <= {e["payload"]["node_id"] for e in refits}
    # Children evaluated afterwards are scored on the new set.
    after = [e["payload"]["node"] for e in events(ctx.store, "milo.node")
             if e["seq"] > cur[0]["seq"] and e["payload"]["node"]["accuracy"] is not None]
    assert all(sorted(n["behavior"]) == sorted(new_tasks) for n in after)


def test_speciate_adds_an_island_that_evolves(scripted_run):
    ctx, summary = scripted_run
    sp = events(ctx.store, "milo.island")
    assert sp, "the scripted Speciate must run"
    new = sp[0]["payload"]["island"]
    assert summary["n_islands"] == 3 and new == 2
    children = [e["payload"]["node"] for e in events(ctx.store, "milo.node")
                if e["payload"]["node"]["island"] == new and e["payload"]["node"]["origin"] == "mutation"]
    assert children, "the new island must run its own rounds"
    assert all(c["mutator"] == "bold" for c in children[:1])


def test_rejected_children_are_visible_to_the_next_mutation(scripted_run):
    ctx, _ = scripted_run
    nodes = [e["payload"]["node"] for e in events(ctx.store, "milo.node")]
    rejected = [n for n in nodes if n["origin"] == "mutation" and not n["admitted"]]
    assert rejected, "a few rounds on the surrogate always produce a rejected child"
    n = rejected[0]
    memos = sorted(Path(ctx.run_dir).rglob(f"island-{n['island']}/round-{n['round'] + 1}.memory.md"))
    if not memos:
        pytest.skip("the island stopped right after the rejection")
    text = memos[0].read_text()
    line = [l for l in text.splitlines() if f"[{n['node_id']}]" in l and l.lstrip().startswith("-")][0]
    assert "verdict: rejected (" in line and "mutation: " in line


def test_summary_reports_true_quality_and_budget(scripted_run):
    _, s = scripted_run
    assert s["best"]["true_quality"] is not None and s["best_seed_true_quality"] is not None
    assert s["executions_used"] > 0 and s["final_test"][0]["k"] == 1
    # The final test evaluation ran outside the search budget.
    ctx, _ = scripted_run
    finals = [r for r in ctx.store.read("rollouts").to_pylist() if r["stage"] == "final"]
    assert finals and ctx.scheduler.budget.executions_used == s["executions_used"]
    assert set(s["islands"]) == {"0", "1", "2"}


def test_stall_resets_only_on_a_new_heldout_best(scripted_run):
    """stall_j counts rounds since island j's last held-out gain: every progress row either
    adds one round to the island's previous count or, after a new held-out best on that
    island (a graft child's included), restarts from zero. Interventions never reset it."""
    ctx, _ = scripted_run
    stall: dict[int, int] = {}
    best: dict[int, float] = {}
    gained: dict[int, bool] = {}
    origin: dict[str, str] = {}
    for e in events(ctx.store):
        p = e["payload"]
        if e["kind"] == "milo.node":
            origin[p["node"]["node_id"]] = p["node"]["origin"]
        elif e["kind"] == "milo.island":
            stall[p["island"]] = 0
        elif e["kind"] == "milo.heldout":
            j = p["island"]
            if j not in best or p["val_accuracy"] > best[j]:
                best[j] = p["val_accuracy"]
                gained[j] = origin.get(p["node_id"]) in ("mutation", "graft")
        elif e["kind"] == "milo.progress":
            j = p["island"]
            before = stall.get(j, 0)
            if p["stall"] == 0:
                assert gained.get(j), f"island {j}: stall reset to 0 without a held-out gain (seq {e['seq']})"
            else:
                assert p["stall"] == before + 1, f"island {j}: stall {before} -> {p['stall']} (seq {e['seq']})"
            stall[j], gained[j] = p["stall"], False


def _snapshot_stalls(markdown: str) -> dict[int, int]:
    """island -> the stall count the population snapshot shows in its summary line."""
    return {int(j): int(n) for j, n in re.findall(r"^## Island (\d+) summary\nmutator: [^\n]*?stall: (\d+)",
                                                  markdown, flags=re.M)}


def test_orchestrator_is_called_only_at_stall_ge_patience_and_sees_the_true_count(scripted):
    """Replaying the event log gives each island's true stall count; the orchestrator is
    called once for every round end that left an island at stall >= P (with P = 1 each
    such round is also P rounds after the island's previous intervention) and never
    otherwise, and each call sees the stalled island and every island's true count."""
    ctx, _, calls = scripted
    stall: dict[int, int] = {}
    due: list[tuple[int, int]] = []  # (island, rounds_done) of round ends with stall >= P
    asked: list[tuple[dict[str, Any], dict[int, int]]] = []  # decision rows + true stalls then
    for e in events(ctx.store):
        p = e["payload"]
        if e["kind"] == "milo.island":
            stall[p["island"]] = 0  # a speciated island starts unstalled
        elif e["kind"] == "milo.progress":
            stall[p["island"]] = p["stall"]
            if p["stall"] >= PATIENCE:
                due.append((p["island"], p["rounds_done"]))
        elif e["kind"] in ("milo.decision", "milo.decision_invalid"):
            asked.append((p, dict(stall)))
    assert len(calls) == len(asked) >= len(SCRIPT), "the script must be played to its end"
    assert sorted((p["trigger"], p["round"]) for p, _ in asked) == sorted(due)
    for call, (row, true_stall) in zip(calls, asked):
        j = row["trigger"]
        assert call["trigger"] == j and row["decision_id"] == f"d{j}-{row['round']}"
        assert f"Stalled island: {j}" in call["snapshot"]
        assert true_stall[j] >= PATIENCE
        assert _snapshot_stalls(call["snapshot"]) == true_stall, row["decision_id"]


MOVE_KEYS = ("reassign", "speciate", "recombine", "curriculum")


def test_every_orchestrator_answer_is_recorded_and_carried_out(scripted):
    """Each call's answer is the decision stored for it, and each of its moves produced
    a milo.move_done row (reassignments as milo.reassign rows naming the same island
    and mutator), followed by one milo.intervention_done."""
    ctx, _, calls = scripted
    rows = events(ctx.store)
    decisions = [e["payload"] for e in rows if e["kind"] == "milo.decision"]
    assert [e for e in rows if e["kind"] == "milo.decision_invalid"] == [], "the script only makes valid moves"
    assert len(decisions) == len(calls)
    for call, d in zip(calls, decisions):
        did, asked, stored = d["decision_id"], call["decision"], d["decision"]
        for key in ("reassign", "speciate", "recombine"):
            assert stored[key] == asked.get(key, []), (did, key)
        assert (stored["curriculum"] or {}).get("tasks") == (asked.get("curriculum") or {}).get("tasks"), did
        mine = [e for e in rows if e["payload"].get("decision_id") == did]
        done = [e["payload"]["kind"] for e in mine if e["kind"] == "milo.move_done"]
        assert sorted(done) == sorted(k for k in MOVE_KEYS if asked.get(k)), did
        assert [e["kind"] for e in mine].count("milo.intervention_done") == 1
        assert mine[-1]["kind"] == "milo.intervention_done"
        reassigned = [(e["payload"]["island"], e["payload"]["mutator"]) for e in mine if e["kind"] == "milo.reassign"]
        assert reassigned == [(a["island"], a["mutator"]) for a in asked.get("reassign", [])], did


def test_every_evaluated_seed_is_in_the_harnesses_table(scripted_run):
    """Seeds not chosen for an island were evaluated too, so they are recorded (no island,
    not admitted, with the reason); the chosen ones are island roots."""
    ctx, _ = scripted_run
    seeds = [h for h in ctx.benchmark.seed_harnesses() if h.name in EXPERT_SEEDS]  # method.seeds' default
    assert len(seeds) == 3
    rows = [r for r in ctx.store.read("harnesses").to_pylist() if r["origin"] == "seed"]
    assert {r["harness_id"] for r in rows} == {h.harness_id for h in seeds}
    unplaced = [r for r in rows if r["island"] is None]
    assert len(unplaced) == len(seeds) - 2  # num_islands=2 in the scripted run
    assert all(not r["admitted"] and "no island" in r["verdict_reason"] for r in unplaced)


def test_the_stored_events_rebuild_the_runs_state(scripted_run):
    """DESIGN §5.11: the store alone holds the run's state. Projecting the stored events
    twice from scratch gives equal states, and that state is the one the run reported."""
    from milo_ray.milo.events import decode
    from milo_ray.milo.state import MiloState

    ctx, summary = scripted_run
    rows = [e for e in events(ctx.store) if e["kind"].startswith("milo.")]
    states = []
    for _ in range(2):
        st = MiloState(eps=0.02, temperature=1.0)
        for e in rows:
            st.apply(decode(e["kind"], e["payload"]))
        states.append(st)
    assert states[0].snapshot() == states[1].snapshot()
    st = states[0]
    assert {str(j): m for j, m in st.assignment.items()} == summary["assignment"]
    assert {str(j): {"rounds": r, "stall": s} for j, (r, s) in st.progress.items()} == \
        {j: {"rounds": isl["rounds"], "stall": isl["stall"]} for j, isl in summary["islands"].items()}
    assert st.version == summary["curriculum_version"] and len(st.decisions) == summary["interventions"]
    best = st.islands[summary["best"]["island"]].best()
    assert (best.node_id, best.val_accuracy) == (summary["best"]["node_id"], summary["best"]["heldout_accuracy"])


def test_each_island_of_the_run_is_one_ray_actor(scripted):
    """The run's islands (the speciated one too) are owned by actors, one each."""
    assert scripted.summary["n_islands"] >= 3  # two seeded, at least one speciated
    assert ISLAND_ACTORS["scripted"] == scripted.summary["n_islands"]


@pytest.mark.slow
def test_a_run_whose_mutator_reaches_nothing_new_stops_as_converged(ray_local, tmp_path):
    """Rung A's greedy one-shot search soon proposes only harnesses it has evaluated; those
    rounds spend no execution, so the budget never stops the run: max_idle_rounds does."""
    from milo_ray.milo.loop import MiloMethod

    ctx = make_ctx(tmp_path, budget=10**6)
    try:
        summary = MiloMethod(num_islands=1, orchestrator=False, mutator_mode="one_shot", memory="flat",
                             parent_selection="best", max_rounds=80, max_idle_rounds=4, **SMALL).run(ctx)
    finally:
        ctx.scheduler.close()
    assert summary["stop_reason"].startswith("converged"), summary["stop_reason"]
    nodes = [e["payload"]["node"] for e in events(ctx.store, "milo.node")]
    last = max(n["round"] for n in nodes)
    assert last < 80
    evaluated = [n["round"] for n in nodes if n["accuracy"] is not None]
    assert last - max(evaluated) >= 3 and max(evaluated) >= 1
