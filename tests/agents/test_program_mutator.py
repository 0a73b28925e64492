"""Offline program mutator: CONFIG/STAGES edits of optimizer programs, steered by the
score trajectories in the evidence and by the rejected edits in the lineage."""

from __future__ import annotations

import time
import types

import numpy as np
import pytest

from milo_ray.agents.mutators.program import OfflineProgramMutator, key_class, parse_program, perturb, rejected_atoms
from milo_ray.agents.protocols import MutationRequest
from milo_ray.core.rollouts import RolloutResult
from milo_ray.core.tasks import Task
from milo_ray.harness.evidence import write_evidence_dir
from milo_ray.harness.model import Harness

# A small optimizer in the seed layout (CONFIG, STAGES, stage_<name>, publish, optimize).
PARENT = '''"""A tiny random local search for the first autocorrelation problem."""
import numpy as np

# Tunables: read only through CONFIG[...].
CONFIG = {
    "anneal_iters": 200,  # proposals per anneal stage
    "temperature": 0.01,  # acceptance temperature, in score units
    "step_size": 0.05,  # relative proposal noise
    "restarts": 2,
    "upsample_factor": 2,
    "accept_frac": 0.3,
}
STAGES = ["anneal", "polish"]  # run in order


def publish(values):
    """Replaced by the runner."""


def _score(h):
    c = np.convolve(h, h)
    return 2 * len(h) * c.max() / h.sum() ** 2


def stage_anneal(h, rng, deadline, problem):
    best, fb = h, _score(h)
    for _ in range(CONFIG["restarts"] * CONFIG["anneal_iters"]):
        if time.monotonic() > deadline:
            break
        x = np.clip(best * (1 + CONFIG["step_size"] * rng.standard_normal(len(best))), 0, None)
        fx = _score(x)
        if fx < fb or rng.random() < CONFIG["accept_frac"] * np.exp(-(fx - fb) / CONFIG["temperature"]) * 0:
            best, fb = x, fx
            publish(best)
    return best


def stage_polish(h, rng, deadline, problem):
    return stage_anneal(h, rng, deadline, problem)


def stage_upsample(h, rng, deadline, problem):
    return np.repeat(h, CONFIG["upsample_factor"])


import time


def optimize(values, *, seed, deadline):
    rng = np.random.default_rng(seed)
    h = np.asarray(values, dtype=float)
    for name in STAGES:
        h = globals()["stage_" + name](h, rng, deadline, "first_autocorrelation")
    return h
'''

SCHEDULE_UP = {"anneal_iters", "temperature", "restarts"}


def _runs(kind: str, i: int) -> dict:
    """One rollout of an optimizer program showing ``kind`` (what the executor returns)."""
    if kind == "stall":  # improved early, then nothing for the remaining 90% of the run
        return dict(score=0.2, latency_s=10.0, trace={"problem": "first_autocorrelation", "n": 8, "start_score": 1.6,
                    "score": 1.54, "reason": None, "trajectory": [[0.1, 1.6], [0.4, 1.55], [1.0, 1.54]],
                    "values": [1.0] * 8, "stdout_tail": "", "stderr_tail": ""})
    if kind == "slow":  # still improving when the deadline came
        return dict(score=0.3, latency_s=10.0, timed_out=i % 2 == 0,
                    trace={"problem": "first_autocorrelation", "n": 8, "start_score": 1.6, "score": 1.52,
                           "reason": None, "trajectory": [[2.0, 1.58], [6.0, 1.55], [9.6, 1.52]],
                           "values": [1.0] * 8, "stdout_tail": "", "stderr_tail": ""})
    reason = "h: first_autocorrelation needs heights >= 0, got h[3] = -0.1"
    return dict(score=0.0, latency_s=10.0, error_kind="harness", error=reason,
                trace={"problem": "first_autocorrelation", "n": 8, "start_score": 1.6, "score": None,
                       "reason": reason, "trajectory": [[1.0, 1.59]], "values": None,
                       "stdout_tail": "", "stderr_tail": ""})


def _evidence(tmp, parent: Harness, kinds: list[str], k: int = 1):
    """The evidence directory, written by the same code that writes it in a run."""
    tasks, results = [], []
    for i, kind in enumerate(kinds):
        t = Task(f"first-{i}", "train", "minimize", 30.0, 0, {"format": "einstein", "problem": "first_autocorrelation"})
        tasks.append(t)
        for r in range(k):
            results.append(RolloutResult(parent.harness_id, t.task_id, r, **_runs(kind, i + r)))
    return write_evidence_dir(tmp / f"ev-{'-'.join(kinds)}-{k}", parent, results, tasks)


def _request(tmp, parent, evidence, seed, memory=""):
    pdir = parent.write_to(tmp / f"parent-{parent.harness_id}")
    return MutationRequest(parent=parent, parent_dir=pdir, evidence_dir=evidence, memory_markdown=memory,
                           workdir=tmp / f"work-{seed}-{len(memory)}", seed=seed, context={})


def _config(source: str) -> dict:
    return {k: v for k, (v, _n) in parse_program(source).config.items()}


def _moved(parent_src: str, child_src: str) -> dict[str, int]:
    a, b = _config(parent_src), _config(child_src)
    return {k: (1 if b[k] > a[k] else -1) for k in a if b[k] != a[k]}


PARENT_H = Harness.from_source(PARENT, name="local-search")


def test_same_seed_same_child_and_report(tmp_path):
    ev = _evidence(tmp_path, PARENT_H, ["stall", "slow", "stall"])
    for personality in ("tuner", "restructurer", "bold"):
        a = OfflineProgramMutator(personality).mutate(_request(tmp_path, PARENT_H, ev, 7))
        b = OfflineProgramMutator(personality).mutate(_request(tmp_path, PARENT_H, ev, 7))
        assert a.child is not None, a.error
        assert a.child.source == b.child.source and a.report == b.report


def test_child_compiles_keeps_the_layout_runs_and_differs(tmp_path):
    ev = _evidence(tmp_path, PARENT_H, ["stall", "stall"])
    for personality in ("tuner", "restructurer", "bold"):
        for seed in range(6):
            req = _request(tmp_path, PARENT_H, ev, seed)
            res = OfflineProgramMutator(personality).mutate(req)
            assert res.child is not None, res.error
            src = res.child.source
            assert src != PARENT and (req.workdir / "harness.py").read_text() == src
            compile(src, "harness.py", "exec")
            prog = parse_program(src)  # optimize, CONFIG and STAGES literals, every stage defined
            assert set(prog.config) == set(_config(PARENT))
            for k, v in prog.config.items():  # types kept; ints stay >= 1
                assert type(v[0]) is type(_config(PARENT)[k])
                assert not isinstance(v[0], int) or v[0] >= 1
            assert "# proposals per anneal stage" in src and "# run in order" in src  # comments survive
            assert res.report.splitlines()[0] and res.usage.cost_usd == 0.0
            mod = types.ModuleType("child")
            exec(compile(src, "harness.py", "exec"), mod.__dict__)
            out = mod.optimize(np.linspace(1.0, 2.0, 8), seed=0, deadline=time.monotonic() + 0.2)
            assert np.all(np.isfinite(out)) and out.ndim == 1


def test_different_seeds_give_different_children(tmp_path):
    ev = _evidence(tmp_path, PARENT_H, ["stall"])
    children = {OfflineProgramMutator("tuner").mutate(_request(tmp_path, PARENT_H, ev, s)).child.source
                for s in range(10)}
    assert len(children) >= 8


def test_stall_moves_schedule_keys_up(tmp_path):
    ev = _evidence(tmp_path, PARENT_H, ["stall", "stall", "slow"])
    for seed in range(12):
        res = OfflineProgramMutator("tuner").mutate(_request(tmp_path, PARENT_H, ev, seed))
        moved = _moved(PARENT, res.child.source)
        assert moved and set(moved) <= SCHEDULE_UP and set(moved.values()) == {1}, (seed, moved)
        assert "stall in 2 of 3 runs" in res.report


def test_still_improving_at_deadline_makes_stages_cheaper(tmp_path):
    ev = _evidence(tmp_path, PARENT_H, ["slow", "slow", "stall"], k=2)  # k > 1: per-rollout files
    for seed in range(12):
        res = OfflineProgramMutator("tuner").mutate(_request(tmp_path, PARENT_H, ev, seed))
        moved = _moved(PARENT, res.child.source)
        assert moved and all(key_class(k) in ("length", "resolution") and d < 0 for k, d in moved.items()), moved


def test_constraint_failures_shrink_steps(tmp_path):
    ev = _evidence(tmp_path, PARENT_H, ["constraint", "constraint", "stall"])
    for seed in range(12):
        res = OfflineProgramMutator("tuner").mutate(_request(tmp_path, PARENT_H, ev, seed))
        moved = _moved(PARENT, res.child.source)
        assert moved and set(moved) <= {"step_size", "temperature"} and set(moved.values()) == {-1}, moved


def test_restructurer_edits_stages_with_defined_functions_only(tmp_path):
    ev = _evidence(tmp_path, PARENT_H, ["stall"])
    seen = set()
    for seed in range(20):
        res = OfflineProgramMutator("restructurer").mutate(_request(tmp_path, PARENT_H, ev, seed))
        stages = parse_program(res.child.source).stages
        assert stages != ["anneal", "polish"] and stages and set(stages) <= {"anneal", "polish", "upsample"}
        seen.add(res.report.split("STAGES ")[1].split()[0])
    assert {"repeat", "add"} <= seen  # a stall favours longer pipelines


@pytest.mark.parametrize("broken, why", [
    (PARENT.replace("CONFIG = {", "SETTINGS = {"), "CONFIG"),
    (PARENT.replace('STAGES = ["anneal", "polish"]', "PIPELINE = ['anneal']"), "STAGES"),
    (PARENT.replace('"polish"]', '"polish", "ghost"]'), "stage_ghost"),
    (PARENT.replace("def optimize(", "def run("), "optimize"),
    (PARENT.replace("def publish(values):", "def publish(values:"), "does not compile"),
])
def test_parent_without_the_layout_is_an_error_not_an_exception(tmp_path, broken, why):
    parent = Harness.from_source(broken)
    res = OfflineProgramMutator("tuner").mutate(_request(tmp_path, parent, tmp_path / "none", 0))
    assert res.child is None and why in res.error


def test_rejected_edit_in_the_lineage_is_not_repeated(tmp_path):
    ev = _evidence(tmp_path, PARENT_H, ["stall"])
    m = OfflineProgramMutator("bold")
    first = m.mutate(_request(tmp_path, PARENT_H, ev, 3))
    label = first.report.splitlines()[0]
    memory = "\n".join([
        "- [n0] depth 0 · seed | acc 0.100 | verdict: admitted",
        f"  - [n1] depth 1 · mutation | mutator: offline-program-bold | mutation: {label} | verdict: rejected (dominated)",
    ])
    banned = rejected_atoms(memory)
    assert banned and len(banned) == label.count(";") + 1
    again = m.mutate(_request(tmp_path, PARENT_H, ev, 3, memory=memory))
    assert again.child is not None and again.child.source != first.child.source
    assert not (rejected_atoms(f"- [x] | mutation: {again.report.splitlines()[0]} | verdict: rejected") & banned)
    # Every schedule key up was rejected: a stall now moves something else, never those.
    memory_all = "\n".join(f"- [n{i}] | mutation: CONFIG.{k} up (1->2) | verdict: rejected (x)"
                           for i, k in enumerate(sorted(SCHEDULE_UP)))
    for seed in range(8):
        res = OfflineProgramMutator("tuner").mutate(_request(tmp_path, PARENT_H, ev, seed, memory=memory_all))
        assert not any(d > 0 and k in SCHEDULE_UP for k, d in _moved(PARENT, res.child.source).items())


def test_moves_stay_within_sane_bounds():
    rng = np.random.default_rng(0)
    for _ in range(300):
        d = int(rng.choice([-1, 1]))
        assert 0 < perturb("beta2", 0.999, d, 0.6, rng) < 1  # fraction-like: stays a fraction
        assert 0 < perturb("jitter_shrink", 0.7, d, 0.6, rng) < 1
        assert perturb("jitter_grow", 1.5, d, 0.6, rng) > 1  # growth-like: stays a growth
        i = perturb("restarts", 1, 1, 0.6, rng)
        assert isinstance(i, int) and i >= 2
        x = perturb("t_hot", 0.01, d, 0.6, rng)
        assert 0.01 / 4 <= x <= 0.01 * 4 and x != 0.01 and (x > 0.01) == (d > 0)


def test_key_classes_read_words_not_substrings():
    assert [key_class(k) for k in ("beta1", "n_steps", "step", "t_hot", "restart_t_hot", "lbfgs_maxiter", "max_points")] \
        == ["other", "length", "step", "temperature", "restarts", "length", "resolution"]


def test_the_evidence_carries_each_runs_grading_and_budget_and_an_early_return_is_a_stall(tmp_path):
    import json

    from milo_ray.agents.mutators.program import classify_run

    parent = Harness.from_source(PARENT, name="parent")
    tasks = [Task("first-0", "train", "minimize", 30.0, 0,
                  {"format": "einstein", "problem": "first_autocorrelation", "budget_s": 25.0})]
    # Returned after 2 s of a 25 s budget, still improving at its end: it gave up early.
    trace = {"problem": "first_autocorrelation", "n": 8, "start_score": 1.6, "score": 1.5, "reason": None,
             "trajectory": [[0.5, 1.58], [1.9, 1.5]], "values": [1.0] * 8, "stdout_tail": "", "stderr_tail": ""}
    ev = write_evidence_dir(tmp_path / "ev", parent, [RolloutResult(parent.harness_id, "first-0", 0, 0.3,
                                                                    latency_s=2.0, trace=trace)], tasks)
    (roll,) = json.loads((ev / "traces" / "first-0" / "result.json").read_text())["rollouts"]
    assert roll["run"] == {"problem": "first_autocorrelation", "n": 8, "start_score": 1.6, "score": 1.5,
                           "reason": None, "budget_s": 25.0}
    points = [(0.5, 1.58), (1.9, 1.5)]
    assert classify_run(points, roll) == "stall"
    assert classify_run(points, {k: v for k, v in roll.items() if k != "run"}) == "slow"  # by wall time alone


@pytest.mark.parametrize("name", ["lse_adam", "lse_lbfgs", "ratchet_upsample", "slp_polish", "subgradient"])
def test_every_seed_program_parses_its_given_stages_counting_as_its_own(name):
    """lse_lbfgs and ratchet_upsample are schedules of the runner's ready-made stages: the
    mutator accepts them, and offers a given stage only where CONFIG holds its settings."""
    from pathlib import Path

    seeds = Path(__file__).resolve().parents[2] / "milo_ray" / "benchmarks" / "einstein" / "seeds"
    prog = parse_program((seeds / name / "harness.py").read_text())
    assert set(prog.stages) <= set(prog.stage_funcs)
    if name == "lse_lbfgs":  # no restart or upsample settings: those given stages are not offered
        assert set(prog.stage_funcs) == {"ladder", "polish"}
