"""Runs a small SSR search in its own process (own Ray instance, the real scheduler,
a Parquet store that writes every row at once) and writes the method's summary as
JSON; used by the kill-and-resume tests (``test_ssr_resume.py``).

Usage: python ssr_resume_runner.py RUN_DIR OUT_JSON [--resume] [--die-before KIND:FIELD=VALUE,...]
                                    [--then-resume-copy COPY_DIR COPY_JSON]

Exit codes: 0 done (OUT_JSON written), 3 killed at the ``--die-before`` point, 4 Ray
did not start (nothing of the run was touched: safe to run again).

``--die-before`` ends the process abruptly (``os._exit``, exit code 3, nothing
flushed or closed) right before SSR writes the first ``KIND`` event whose payload and
columns (round, harness_id) have all the given fields: a kill at an exact point of
the run. ``--resume`` runs with ``resumed=True`` on the same run directory.
``--then-resume-copy`` then copies the finished run to COPY_DIR and resumes the copy.

Every judge and optimizer call is appended, once its answer is back, to
``RUN_DIR/agent_calls.jsonl`` (one ``write`` of one line per call, so lines written
before a kill survive it), tagged with the session (``first`` or ``resume``), judge
calls also with a digest of the trajectory they were about: the tests compare what
each session paid for, and match it to the answers the store recorded.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import threading
from collections import Counter
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

RUN_ID = "ssr-resume-test"
SEED = 8
BUDGET = 90
# Small enough for seconds of search per run, big enough for every step to happen
# (with SEED 8): rounds 0 and 1 each race two stages and accept a child, so rounds 1
# and 2 refresh; the budget then stops the run and the final and initial harnesses
# are tested.
SIZES = {"train": 6, "val": 4, "test": 4}
CONFIG = dict(initial="minimal", scales=[0.5, 1.0], b_v=[2, 2], b_s=1, b_f=1, rollouts=2, stages=2, patience=2,
              test_rollouts=2, max_concurrent_candidates=2, judge_workers=2)
CALLS = "agent_calls.jsonl"
DIE_EXIT_CODE = 3
RAY_START_FAILED = 4


def _append_line(path: Path, record: dict) -> None:
    # One O_APPEND write per line: concurrent writers (judge threads, optimizer Ray
    # workers) never interleave, and a completed write survives the process's death.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record, sort_keys=True) + "\n").encode())
    finally:
        os.close(fd)


class RecordingJudge:
    """The offline judge, with every answered call logged. A call's identity is its
    input (trajectory, feedback, task) and how many times this session asked that
    same input before (a malformed answer is re-asked with the same input).

    Each distinct input gets its own offline judge, so an answer depends on the input
    and the attempt only: the offline judge otherwise counts attempts per task id
    across rounds, and a session that (rightly) skips recorded calls would then get
    other answers to the later ones than an uninterrupted session did."""

    def __init__(self, make, log: Path, session: str) -> None:
        self.make, self.log, self.session = make, log, session
        self.name = getattr(make(), "name", None) or "judge"
        self._seen: Counter[str] = Counter()
        self._inner: dict[str, object] = {}
        self._lock = threading.Lock()

    def judge(self, trajectory, feedback, task_id):
        digest = hashlib.sha256(json.dumps([trajectory, feedback, task_id], sort_keys=True, default=str)
                                .encode()).hexdigest()
        with self._lock:
            n = self._seen[digest]
            self._seen[digest] += 1
            inner = self._inner.setdefault(digest, self.make())
        out = inner.judge(trajectory, feedback, task_id)
        _append_line(self.log, {"session": self.session, "agent": "judge", "task_id": task_id,
                                "call": f"{digest}#{n}", "trajectory": trajectory_digest(trajectory)})
        return out


def trajectory_digest(trajectory) -> str:
    """Names the trajectory a judge call was about (the tests match it to the trace of a
    recorded ``ssr.judged`` event)."""
    return hashlib.sha256(json.dumps(trajectory, sort_keys=True, default=str).encode()).hexdigest()


class RecordingOptimizer:
    """The offline candidate optimizer, with every answered call logged. Shipped to the
    Ray task that generates a candidate (this class is pickled by value), so the log
    path must be visible there: it is, on one machine."""

    def __init__(self, inner, log: Path, session: str) -> None:
        self.inner, self.log, self.session = inner, log, session
        self.name = getattr(inner, "name", "optimizer")

    def mutate(self, request):
        out = self.inner.mutate(request)
        ctx = request.context or {}
        _append_line(self.log, {"session": self.session, "agent": "optimizer",
                                "call": f"{request.parent.harness_id}/r{ctx.get('round')}/c{ctx.get('candidate_index')}"
                                        f"/s{request.seed}"})
        return out


def install_kill_point(spec: str) -> None:
    from milo_ray.search.events import EventLog

    kind, _, conds = spec.partition(":")
    want = dict(c.split("=", 1) for c in conds.split(",") if c)
    event = EventLog.write

    def event_or_die(self, k, payload=None, **cols):
        if k == kind:
            fields = {**cols, **(payload or {})}
            if all(str(fields.get(f)) == v for f, v in want.items()):
                os._exit(DIE_EXIT_CODE)
        return event(self, k, payload, **cols)

    EventLog.write = event_or_die


def run(run_dir: Path, out: Path, *, resume: bool) -> None:
    """One session of the search on ``run_dir`` (a fresh store, scheduler and agents)."""
    from milo_ray.agents.embedder import HashingEmbedder
    from milo_ray.agents.judges.offline import OfflineJudge
    from milo_ray.agents.mutators.offline import OfflineCandidateOptimizer
    from milo_ray.benchmarks.surrogate import SurrogateBenchmark
    from milo_ray.context import RunContext
    from milo_ray.execution.budget import BudgetLedger
    from milo_ray.execution.scheduler import RolloutScheduler
    from milo_ray.ssr.loop import SSRMethod
    from milo_ray.store.parquet import ParquetRunStore
    from ssr_slice import SliceBenchmark

    bench = SliceBenchmark(SurrogateBenchmark(preset="surrogate_swepro", seed=0), SIZES)
    store = ParquetRunStore(run_dir, run_id=RUN_ID, flush_rows=1)
    tasks = {t.task_id: t for s in bench.splits().values() for t in s}
    sched = RolloutScheduler(executor_config=bench.executor_config(), tasks=tasks, store=store, model_id="offline",
                             run_id=RUN_ID, budget=BudgetLedger(executions=BUDGET), progress=False)
    log, session = run_dir / CALLS, "resume" if resume else "first"
    agents = {"judge": RecordingJudge(lambda: OfflineJudge(malformed_rate=0.1), log, session),
              "optimizer": RecordingOptimizer(OfflineCandidateOptimizer(), log, session),
              "embedder": HashingEmbedder(dim=64)}
    ctx = RunContext(run_id=RUN_ID, run_dir=run_dir, seed=SEED, store=store, benchmark=bench, scheduler=sched,
                     model_id="offline", resumed=resume, agents=agents)
    try:
        summary = SSRMethod(**CONFIG).run(ctx)
    finally:
        sched.close()
    store.close()
    out.write_text(json.dumps(summary, indent=1, sort_keys=True, default=str))


def main() -> None:
    run_dir, out, resume = Path(sys.argv[1]), Path(sys.argv[2]), "--resume" in sys.argv
    if "--die-before" in sys.argv:
        install_kill_point(sys.argv[sys.argv.index("--die-before") + 1])
    from milo_ray.execution.cluster import start_local

    try:
        start_local(num_cpus=2, slots=8)  # private, even when `ray start` left one running here
    except Exception as e:  # e.g. the raylet's start-up timed out on a loaded machine
        print(f"ray did not start: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        os._exit(RAY_START_FAILED)  # nothing of the run was touched yet: the caller may retry
    run(run_dir, out, resume=resume)
    if "--then-resume-copy" in sys.argv:
        # Resuming a run that had finished: on a copy, so run_dir stays the uninterrupted
        # run. Same process and Ray instance (a Ray start costs more than the search),
        # but a fresh store, scheduler and agents, as a new process would build them.
        at = sys.argv.index("--then-resume-copy")
        copy_dir, copy_out = Path(sys.argv[at + 1]), Path(sys.argv[at + 2])
        shutil.copytree(run_dir, copy_dir)
        run(copy_dir, copy_out, resume=True)
    # Everything is stored and written: skip Ray's orderly shutdown, which takes
    # seconds. Ray's reaper (and the tests, which end the process group) stop the
    # rest of this private instance.
    os._exit(0)


if __name__ == "__main__":
    main()
