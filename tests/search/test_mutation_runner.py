"""The shared mutation runner: time cap, one agent per process, child read-back,
validation, usage, and files shipped to workers that cannot see the driver's disk."""

from __future__ import annotations

import asyncio
import collections
import time
from pathlib import Path

import pytest

from milo_ray.agents.protocols import MutationRequest
from milo_ray.harness.model import ENTRY_FILE, Harness
from milo_ray.search.mutation import (ShippedFiles, ValidationOptions, run_mutation, run_mutation_async,
                                      run_mutations)

PARENT = Harness.from_source("def build_agent(model, backend):\n    return None\n", name="parent")
COUNTING = "milo_ray.testing.fake_agents.CountingMutator"
SCRIPTED = "milo_ray.testing.fake_agents.ScriptedOutputMutator"


def request(tmp: Path, i: int = 0) -> MutationRequest:
    parent_dir = PARENT.write_to(tmp / "parent")
    evidence = tmp / "evidence"
    evidence.mkdir(exist_ok=True)
    (evidence / "report.md").write_text("2 of 3 tasks failed")
    return MutationRequest(parent=PARENT, parent_dir=parent_dir, evidence_dir=evidence, memory_markdown="",
                           workdir=tmp / f"work-{i}", seed=i)


def log_lines(log: Path) -> collections.Counter:
    return collections.Counter(line.strip() for line in log.read_text().splitlines())


def test_hung_agent_is_stopped_at_the_cap_in_process(tmp_path):
    spec = {"_target_": COUNTING, "log": str(tmp_path / "log"), "sleep_s": 30}
    t0 = time.monotonic()
    out = run_mutation(spec, request(tmp_path), time_cap_s=0.5)
    assert time.monotonic() - t0 < 10
    assert out.child is None and out.error == "timed out after 0.5s" and out.reason == out.error
    assert out.usage.cost_usd is None and out.usage.error == out.error


def test_hung_optimizer_is_stopped_at_the_cap_in_ray_tasks(tmp_path, ray_local):
    """SSR's path: a hung candidate is rejected at the cap, the others are kept."""
    log = tmp_path / "log"
    reqs = [request(tmp_path, i) for i in range(2)]
    slow = {"_target_": COUNTING, "log": str(log), "sleep_s": 60}
    t0 = time.monotonic()
    outs = run_mutations(slow, reqs, time_cap_s=1.0, validation=ValidationOptions(enabled=False), max_concurrent=2)
    assert time.monotonic() - t0 < 45
    assert [o.error for o in outs] == ["timed out after 1s"] * 2


def test_hung_mutator_is_stopped_at_the_pool_s_cap_under_its_seat(tmp_path, ray_local):
    """MILO's path: the pool actor grants a seat with the spec and its cap; the mutation
    runs through the same runner under that cap."""
    from milo_ray.milo.events import Init
    from milo_ray.milo.mutator_pool_actor import MutatorPoolActor, PoolRef

    specs = [{"_target_": COUNTING, "log": str(tmp_path / "log"), "sleep_s": 60, "name": "slow"}]

    async def go():
        pool = PoolRef(lambda: MutatorPoolActor.remote(specs, 1.0, 1, "cap-test"))
        pool.apply(Init([], [], [], [0], {0: "slow"}))
        t0 = time.monotonic()
        async with pool.seat(0, "m0") as lease:
            out = await run_mutation_async(lease.spec, request(tmp_path), time_cap_s=lease.time_cap_s,
                                           validation=ValidationOptions(enabled=False), num_cpus=0.5)
        pool.kill()
        return time.monotonic() - t0, out

    took, out = asyncio.run(go())
    assert took < 45
    assert out.child is None and out.error == "timed out after 1s"


def test_agent_is_built_once_per_process_however_many_mutations_it_serves(tmp_path, ray_local):
    log = tmp_path / "log"
    spec = {"_target_": COUNTING, "log": str(log)}
    reqs = [request(tmp_path, i) for i in range(8)]
    outs = run_mutations(spec, reqs, time_cap_s=30, validation=ValidationOptions(enabled=False), max_concurrent=2)
    assert all(o.ok for o in outs)
    counts = log_lines(log)
    inits = {k.split()[1]: v for k, v in counts.items() if k.startswith("init")}
    calls = {k.split()[1]: v for k, v in counts.items() if k.startswith("call")}
    assert sum(calls.values()) == 8
    assert set(inits) == set(calls) and set(inits.values()) == {1}, counts
    assert sum(calls.values()) > len(inits)  # some process served more than one mutation


def test_async_runner_returns_the_child_and_its_usage(tmp_path, ray_local):
    spec = {"_target_": COUNTING, "log": str(tmp_path / "log"), "input_tokens": 1200, "output_tokens": 300,
            "cost_usd": 0.25}
    out = asyncio.run(run_mutation_async(spec, request(tmp_path), time_cap_s=30, num_cpus=0.5))
    assert out.ok and out.child.source.endswith("# edit for seed 0\n")
    assert (out.usage.input_tokens, out.usage.output_tokens, out.usage.cost_usd) == (1200, 300, 0.25)
    assert out.usage.seconds > 0


@pytest.mark.parametrize("mode,error,validation_error", [
    ("crash", "mutator crashed: RuntimeError: boom", None),
    ("nothing", "mutator produced no child", None),
    ("same", None, "duplicate: identical to the parent"),
    ("broken", None, "syntax"),
])
def test_a_bad_agent_or_child_is_an_outcome_never_an_exception(tmp_path, mode, error, validation_error):
    out = run_mutation({"_target_": SCRIPTED, "mode": mode}, request(tmp_path), time_cap_s=30,
                       validation=ValidationOptions(timeout_s=30))
    assert not out.ok
    assert out.error == error
    if validation_error is None:
        assert out.validation_error is None
    else:
        assert validation_error in out.validation_error.lower()
        assert out.child is not None  # kept: MILO records rejected children with their source


def test_child_written_to_the_workdir_is_read_back_and_validated(tmp_path):
    out = run_mutation({"_target_": SCRIPTED, "mode": "workdir"}, request(tmp_path), time_cap_s=30,
                       validation=ValidationOptions(timeout_s=30))
    assert out.ok, out.reason
    assert out.child.source.endswith("# written to the workdir\n")
    assert out.usage.input_tokens == 7


def test_forbidden_fragment_in_the_child_fails_validation(tmp_path):
    spec = {"_target_": COUNTING, "log": str(tmp_path / "log")}
    out = run_mutation(spec, request(tmp_path, 3), time_cap_s=30,
                       validation=ValidationOptions(forbidden=("seed",), timeout_s=30))
    assert out.child is not None and out.validation_error and "seed" in out.validation_error


def test_shipped_files_reach_a_worker_that_cannot_see_the_driver_disk(tmp_path):
    """Multi-node: the parent, the evidence and every path the memory text and the
    context name are unpacked on the worker and the request rewritten to them."""
    import shutil

    req = request(tmp_path)
    notes = tmp_path / "memory" / "notes.md"
    notes.parent.mkdir()
    notes.write_text("island 2 stalled")
    req = MutationRequest(parent=req.parent, parent_dir=req.parent_dir, evidence_dir=req.evidence_dir,
                          memory_markdown=f"see {req.evidence_dir}/report.md and {notes}", workdir=req.workdir,
                          seed=0, context={"memory_path": str(notes)})
    shipped = ShippedFiles.pack(req)
    for path in (req.parent_dir, req.evidence_dir, notes.parent):  # the worker's view: none of it exists
        shutil.rmtree(path)
    out = run_mutation({"_target_": "milo_ray.testing.fake_agents.EvidenceReadingMutator"}, req, time_cap_s=30,
                       validation=ValidationOptions(enabled=False), shipped=shipped)
    assert out.ok, out.reason
    assert out.child.source.count("# read: 2 of 3 tasks failed") == 2  # via evidence_dir and via the memory text
    assert out.child.source.count("# read: island 2 stalled") == 2  # via the memory text and the context


def test_packing_a_missing_directory_is_an_error(tmp_path):
    req = request(tmp_path)
    import shutil

    shutil.rmtree(req.evidence_dir)
    with pytest.raises(ValueError, match="evidence_dir"):
        ShippedFiles.pack(req)


def test_a_hung_constructor_neither_breaks_the_cap_nor_blocks_other_agents(tmp_path):
    slow = {"_target_": "milo_ray.testing.fake_agents.SlowToBuildMutator", "log": str(tmp_path / "slow"),
            "build_s": 20}
    t0 = time.monotonic()
    out = run_mutation(slow, request(tmp_path, 0), time_cap_s=0.5)
    assert out.error == "timed out after 0.5s" and time.monotonic() - t0 < 5
    fast = {"_target_": COUNTING, "log": str(tmp_path / "fast")}
    t0 = time.monotonic()
    assert run_mutation(fast, request(tmp_path, 1), time_cap_s=10, validation=ValidationOptions(enabled=False)).ok
    assert time.monotonic() - t0 < 5


def test_two_specs_get_two_agents_and_a_forgotten_agent_is_built_again(tmp_path):
    from milo_ray.search.mutation import agent_for, forget_agent

    a = {"_target_": COUNTING, "log": str(tmp_path / "a")}
    b = {"_target_": COUNTING, "log": str(tmp_path / "b")}
    assert agent_for(a) is agent_for(dict(a)) and agent_for(a) is not agent_for(b)
    first = agent_for(a)
    forget_agent(a)
    assert agent_for(a) is not first


def test_runs_and_sessions_never_share_an_agent(tmp_path):
    """An agent keeps state between calls: a run (or a resumed session) must not inherit
    another's; old sessions are dropped so long-lived workers do not grow."""
    from milo_ray.search import agent_cache as mutation

    spec = {"_target_": COUNTING, "log": str(tmp_path / "a")}
    one, two = mutation.agent_for(spec, "run-1"), mutation.agent_for(spec, "run-2")
    assert one is not two and mutation.agent_for(spec, "run-1") is one
    for i in range(mutation.MAX_SCOPES + 2):
        mutation.agent_for(spec, f"later-{i}")
    assert len(mutation._AGENTS) <= mutation.MAX_SCOPES
    assert mutation.agent_for(spec, "run-1") is not one  # evicted, built again


def test_a_stale_child_in_a_reused_workdir_is_not_read_back(tmp_path):
    req = request(tmp_path)
    Path(req.workdir).mkdir(parents=True)
    (Path(req.workdir) / ENTRY_FILE).write_text("def build_agent(model, backend):\n    return 'stale'\n")
    out = run_mutation({"_target_": SCRIPTED, "mode": "nothing"}, req, time_cap_s=30)
    assert out.child is None and out.error == "mutator produced no child"


def test_the_cap_runs_from_the_start_of_the_task_not_from_submission(tmp_path, ray_local, monkeypatch):
    """Four calls of 2 s under a 3 s cap on two CPUs: two wait for a CPU for ~2 s, and
    none of them may be counted as timed out."""
    monkeypatch.setattr("milo_ray.search.mutation.GRACE_S", 0.5)
    spec = {"_target_": COUNTING, "log": str(tmp_path / "log"), "sleep_s": 2.0}
    outs = run_mutations(spec, [request(tmp_path, i) for i in range(4)], time_cap_s=3.0,
                         validation=ValidationOptions(enabled=False), max_concurrent=4, num_cpus=1)
    assert [o.error for o in outs] == [None] * 4


def test_a_timed_out_agent_is_killed_with_its_worker_process(tmp_path, ray_local):
    import os

    log = tmp_path / "log"
    spec = {"_target_": COUNTING, "log": str(log), "sleep_s": 120}
    (out,) = run_mutations(spec, [request(tmp_path)], time_cap_s=1.0, validation=ValidationOptions(enabled=False))
    assert out.error == "timed out after 1s"
    (pid,) = {int(k.split()[1]) for k in log_lines(log) if k.startswith("call")}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    pytest.fail(f"the worker {pid} running the hung agent is still alive")


def test_the_agents_key_variables_reach_a_mutation_task_that_never_had_them(tmp_path, ray_local, monkeypatch):
    # The Ray workers were started before this variable existed in the driver: only the
    # task's argument hands it over (as it must to workers on other nodes) -- to the agent,
    # never into the worker's environment.
    monkeypatch.delenv("MILO_RAY_TEST_AGENT_KEY", raising=False)
    spec = {"_target_": "milo_ray.testing.fake_agents.EnvReportingMutator", "variable": "MILO_RAY_TEST_AGENT_KEY"}
    without = asyncio.run(run_mutation_async(spec, request(tmp_path, 1), time_cap_s=60, num_cpus=0.5))
    assert without.report == "<unset> not-in-env"
    given = asyncio.run(run_mutation_async(spec, request(tmp_path, 2), time_cap_s=60, num_cpus=0.5,
                                           env={"MILO_RAY_TEST_AGENT_KEY": "k-123"}))
    assert given.report == "k-123 not-in-env"
    many = run_mutations(spec, [request(tmp_path, 3)], time_cap_s=60, num_cpus=0.5, use_ray=True,
                         env={"MILO_RAY_TEST_AGENT_KEY": "k-456"})
    assert many[0].report == "k-456 not-in-env"
