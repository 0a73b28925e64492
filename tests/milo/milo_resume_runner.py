"""Runs one session of a small MILO search in its own process (Parquet store, offline
agents) and writes the final lineage/assignment/stall state as JSON; used by the
kill-and-resume tests (``test_resume.py``, checks in ``milo_resume_checks.py``).

Usage: python milo_resume_runner.py RUN_DIR OUT_JSON [--resume] [--free]
           [--ray-address ADDR] [--die-before KIND:FIELD=VALUE,...] [--die-after KIND:...]
       python milo_resume_runner.py --hold-ray

``--hold-ray`` starts a private Ray instance, prints its address and auth mode (JSON)
and keeps it until its stdin closes: the instance the tests' sessions join (with
``RAY_AUTH_MODE`` set to that mode).

``--free`` runs free-running islands (``round_sync=False``, the product default);
otherwise islands advance in lock-step. ``--ray-address`` joins a Ray instance the
test keeps running (starting Ray costs seconds per session); without it the session
starts a private one.

``--die-before`` ends the process abruptly (``os._exit``, exit code 3, nothing
flushed or closed) right before the first ``KIND`` event whose payload (or the
payload's ``node``) has all the given fields: a kill at an exact point of the run.
``--die-after`` (same syntax) ends it right after that event is stored, before the
driver applies it or does anything else.

Every paid agent call (each mutation, each orchestrator decision and graft) is
appended to ``RUN_DIR/agent_call_log.jsonl`` *before* the call, one fsynced line per
call, so the record survives a kill and shows which calls a resumed session repeated.
The log is the tests' own file: the store never reads it."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

CALL_LOG = "agent_call_log.jsonl"
RUN_SEED = 0
PERSONALITIES = ("conservative", "bold", "sloppy")
# The smallest search that still passes every step the kill points name: two islands,
# patience 1 (an intervention after almost every round: grafts, a curriculum change
# with re-fits, speciation), two rounds per island, one rollout per task.
CONFIG = dict(num_islands=2, patience=1, max_rounds=2, k_search=1, k_val=1, k_test=1, search_size=8, val_size=6)


def log_call(path: str | os.PathLike, record: dict[str, Any]) -> None:
    """Append one line and fsync it: a SIGKILL right after the call started keeps it."""
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)  # one O_APPEND write: lines of concurrent writers never interleave
        os.fsync(fd)
    finally:
        os.close(fd)


class LoggedMutator:
    """The offline mutator, recording each call (runs in a Ray task, so it logs itself)."""

    def __init__(self, personality: str, call_log: str, session: int) -> None:
        from milo_ray.agents.mutators.offline import OfflineMutator

        self.inner = OfflineMutator(personality=personality)
        self.call_log, self.session = call_log, session

    def mutate(self, request):
        j, r = int(request.context["island"]), int(request.context["round"])
        log_call(self.call_log, {"session": self.session, "agent": "mutator", "work": f"{j}-{r}", "pid": os.getpid()})
        return self.inner.mutate(request)


class LoggedOrchestrator:
    """The offline orchestrator, recording each decision and graft call."""

    def __init__(self, call_log: str, session: int) -> None:
        from milo_ray.agents.orchestrators.offline import OfflineOrchestrator

        self.inner = OfflineOrchestrator()
        self.call_log, self.session = call_log, session

    def decide(self, snapshot_markdown: str, state: dict[str, Any], seed: int) -> dict[str, Any]:
        from milo_ray.core.seeds import derive_seed

        # The call does not name its round; the seed is derive_seed(run seed, "orchestrate", j, r).
        j = int(state["trigger"])
        r = next((r for r in range(1000) if derive_seed(RUN_SEED, "orchestrate", j, r) == seed), None)
        log_call(self.call_log, {"session": self.session, "agent": "orchestrator.decide", "work": f"d{j}-{r}",
                                 "pid": os.getpid()})
        return self.inner.decide(snapshot_markdown, state, seed)

    def graft(self, request):
        # The workdir a graft runs in is private to its task; the request names the node it makes.
        log_call(self.call_log, {"session": self.session, "agent": "orchestrator.graft", "work": request.context["node_id"],
                                 "pid": os.getpid()})
        return self.inner.graft(request)


def state_of(run) -> dict:
    st = run.state
    out = {"assignment": {str(j): m for j, m in sorted(st.assignment.items())}, "islands": {}}
    for j in sorted(st.islands):
        isl = st.islands[j]
        out["islands"][str(j)] = {
            "rounds": isl.rounds_done, "stall": isl.stall,
            "nodes": [[n.node_id, n.harness_id, n.parent, n.co_parent, n.admitted, n.verdict_reason,
                       n.mutator, n.val_accuracy] for n in isl.nodes()],
        }
    return out


DIE_EXIT_CODE = 3


def install_kill_point(spec: str, *, after: bool = False) -> None:
    """Patch ``MiloRun.emit`` (the one place events are stored and applied) to end the
    process before the matching event is stored, or right after it is stored and
    before it is applied."""
    from milo_ray.milo.events import MILO_EVENTS
    from milo_ray.milo.loop import MiloRun

    kind, _, conds = spec.partition(":")
    want = dict(c.split("=", 1) for c in conds.split(",") if c)
    emit = MiloRun.emit

    def die(*_: Any, **__: Any) -> None:
        os._exit(DIE_EXIT_CODE)

    def emit_or_die(self, event, **cols):
        if MILO_EVENTS.kind_of(event) == kind:
            payload = event.to_payload()
            fields = {**payload.get("node", {}), **payload}
            if all(str(fields.get(f)) == v for f, v in want.items()):
                if not after:
                    die()
                self._apply = die  # emit stores the row, then applies it: die there
        return emit(self, event, **cols)

    MiloRun.emit = emit_or_die


def _opt(name: str) -> str | None:
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else None


def _next_session(log: Path) -> int:
    """Sessions of this run directory are numbered 0, 1, ... in the call log."""
    if not log.exists():
        return 0
    return sum(json.loads(line).get("agent") == "session" for line in log.read_text().splitlines() if line.strip())


def hold_ray() -> None:
    import ray

    from milo_ray.execution.cluster import start_local

    info = start_local(num_cpus=2, slots=8)
    # Joining drivers need the auth mode Ray chose for it (a new local instance turns
    # token auth on by default and records that in this process's environment).
    print(json.dumps({"address": info.address,
                      "auth_mode": os.environ.get("RAY_AUTH_MODE", "")}), flush=True)
    sys.stdin.read()  # until the test closes the pipe (or dies)
    ray.shutdown()


def main() -> None:
    if "--hold-ray" in sys.argv:
        return hold_ray()
    run_dir, out, resume = Path(sys.argv[1]), Path(sys.argv[2]), "--resume" in sys.argv
    if _opt("--die-before"):
        install_kill_point(_opt("--die-before"))
    if _opt("--die-after"):
        install_kill_point(_opt("--die-after"), after=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / CALL_LOG
    session = _next_session(log)
    log_call(log, {"session": session, "agent": "session", "resume": resume, "pid": os.getpid()})
    from milo_ray.execution.cluster import join, start_local

    if _opt("--ray-address"):
        join(_opt("--ray-address"))
    else:  # private: never join another Ray instance running on this machine
        start_local(num_cpus=2, slots=8)
    from milo_ray.benchmarks.surrogate import SurrogateBenchmark
    from milo_ray.context import RunContext
    from milo_ray.execution.budget import BudgetLedger
    from milo_ray.execution.scheduler import RolloutScheduler
    from milo_ray.milo.config import MiloConfig
    from milo_ray.milo.loop import MiloRun
    from milo_ray.store.parquet import ParquetRunStore

    bench = SurrogateBenchmark(preset="surrogate_tb21", seed=0)
    store = ParquetRunStore(run_dir, run_id="resume-test", flush_rows=1)
    tasks = {t.task_id: t for s in bench.splits().values() for t in s}
    sched = RolloutScheduler(executor_config=bench.executor_config(), tasks=tasks, store=store,
                             model_id="offline-surrogate", run_id="resume-test", budget=BudgetLedger())
    logged = {"call_log": str(log), "session": session}
    mutators = [{"_target_": "milo_resume_runner.LoggedMutator", "personality": p, **logged} for p in PERSONALITIES]
    ctx = RunContext(run_id="resume-test", run_dir=run_dir, seed=RUN_SEED, store=store, benchmark=bench,
                     scheduler=sched, model_id="offline-surrogate", resumed=resume,
                     agents={"mutators": mutators, "orchestrator": {
                         "_target_": "milo_resume_runner.LoggedOrchestrator", **logged}})
    cfg = MiloConfig(**CONFIG, round_sync="--free" not in sys.argv)

    async def go():
        run = MiloRun(cfg, ctx)
        await run.main()
        return state_of(run)

    state = asyncio.run(go())
    sched.close()
    store.close()
    out.write_text(json.dumps(state, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
