"""The instance-level track with an agent in the loop (MILO App. E, LLM variant): the
evolved harness is an agent that writes optimizer programs (``benchmark=einstein_agent``).

A task is (problem, start, parent program). The agent works in a sandbox whose workdir
(``/app``) holds

* ``start.npy``: the start (float64 vector);
* ``optimizer.py``: the parent, one of the seed optimizer programs;
* ``run_optimizer.py``: the runner the grader uses, so the agent can try a program
  exactly as it will be graded (``python3 run_optimizer.py optimizer.py start.npy
  PROBLEM SEED BUDGET_S GRACE_S`` writes ``best.npy``, ``trajectory.jsonl`` and
  ``status.json`` into the current directory);
* ``autocorr_kit.py`` and ``optimizer_blocks.py``: the problem's formulas (scores, the
  smoothed max and its gradient, projections) and the building blocks (the ratchet,
  the L-BFGS ladder and polish, upsampling, warm restarts, ready-made stages) the runner
  gives the program.

``python3`` there is the worker's own interpreter (numpy and scipy importable), shown
read-only. The agent's answer is ``optimizer.py`` as it leaves it. Grading
(:meth:`EinsteinAgentFormat.verify`) copies that one file into a fresh directory with a
fresh start, runs it for the task's budget, and checks and scores the final point with
the project's kernels on the host, as ``executor=optimizer`` grades an evolved program:
the reward is the normalized gain over the start; a program that fails, publishes
nothing or ends on an infeasible point earns 0 with the reason in the trace. Nothing
else the agent left in the workspace plays a part.

Offline (no model endpoint) the track evolves the optimizer programs directly
(``benchmark=einstein``); this variant needs a real solver model (``model=litellm``).
"""

from __future__ import annotations

import hashlib
import io
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from milo_ray.benchmarks.einstein.benchmark import (
    DEFINITIONS, GIVEN_NAMES, SCORING_ALLOWANCE_S, EinsteinBenchmark, _is_int, _is_number, describe_start,
)
from milo_ray.benchmarks.einstein.problems import score
from milo_ray.benchmarks.einstein.programs import grade_program, run_program
from milo_ray.boundary.optimizer_process import runner_files
from milo_ray.benchmarks.einstein.starts import start_values
from milo_ray.benchmarks.task_format import SETUP_ALLOWANCE_S
from milo_ray.core.tasks import Task, Verdict
from milo_ray.boundary.inside.optimizer_runner import BLOCKS_FILE, KIT_FILE
from milo_ray.boundary.sandbox.base import TESTS_DIR, Sandbox, SandboxSpec
from milo_ray.boundary.sandbox.interpreter import interpreter_env, interpreter_paths
from milo_ray.harness.model import ENTRY_FILE, Harness
from milo_ray.harness.seeds import load_seeds

WORKDIR = "/app"
PROGRAM_FILE = "optimizer.py"
START_FILE = "start.npy"
RUNNER_FILE = "run_optimizer.py"
# Where the grader runs the agent's program: a directory of its own, filled afresh.
GRADE_DIR = f"{TESTS_DIR}/grade"
# The seed an optimizer run is graded with: one fixed run per rollout, so two rollouts of
# a harness differ only by what their agents wrote.
PROGRAM_SEED = 0
_OUTPUT_CHARS = 4000

WORKSPACE = """\
Your workspace is {workdir}:
  {start}         the start, a numpy .npy file of float64 heights (np.load)
  {program}      the parent optimizer program: improve it, or replace it
  {runner}  the exact runner that will grade your program
  {kit}   the problem's formulas the runner gives your program
  {blocks}  the building blocks the runner gives your program

Write your optimizer to {workdir}/{program}. It must be one Python file that defines

    def optimize(values, *, seed, deadline):
        # values: np.ndarray of float64 (the start); deadline: a time.monotonic() value
        return best_values  # np.ndarray of float64; a different length (a finer grid) is allowed

{given} (Their code is in {workdir}/{kit} and {workdir}/{blocks}.) Publish every strictly better feasible point. Import only numpy,
scipy and the standard library; there is no network.

Grading: your {program} alone is copied to a fresh directory and run on this start for {budget:g} s (stopped
{grace:g} s past its deadline), seed {seed}; the final point is checked against the constraints and scored
exactly. Try your program exactly as it will be graded, from a scratch directory:

    mkdir -p /tmp/try && cd /tmp/try && python3 {workdir}/{runner} {workdir}/{program} {workdir}/{start} \\
        {problem} {seed} {budget:g} {grace:g}

which writes status.json (how the run ended), trajectory.jsonl (lines [seconds, score, publishes]) and best.npy
(the final point) into the current directory. Shorter budgets are fine for quick experiments."""


def agent_instruction(problem: str, start_note: str, start_score: float, parent: str, budget_s: float,
                      grace_s: float) -> str:
    """The self-contained text the agent reads for one task."""
    return "\n\n".join([
        f"Problem: {problem}.\n{DEFINITIONS[problem]}",
        f"Start: {start_note} Its score is {start_score:.10g}.",
        f"The parent optimizer program is the `{parent}` program. Task: make the optimizer that improves this start "
        "the most within the budget (a lower score). The reward is the relative gain of the graded run's final score "
        "over the start's score, on a log scale; an infeasible point, a failing program or no gain earns 0.",
        WORKSPACE.format(workdir=WORKDIR, start=START_FILE, program=PROGRAM_FILE, runner=RUNNER_FILE,
                         kit=KIT_FILE, blocks=BLOCKS_FILE, given=GIVEN_NAMES.format(problem=problem), problem=problem,
                         budget=budget_s, grace=grace_s, seed=PROGRAM_SEED),
    ])


class EinsteinAgentBenchmark(EinsteinBenchmark):
    """EinsteinArena problems as tasks for an agent that writes optimizer programs
    (``artifact_entry = "build_agent"``): one task per (problem, start, parent program).

    problem, starts, splits, split_seed: as :class:`EinsteinBenchmark` (splits are drawn
      over starts: a start's tasks, one per parent, stay in one split; split counts are
      starts per problem).
    budget_s / grace_s: the graded optimizer run's budget and how long past its deadline
      it may run before it is stopped.
    parents / parents_dir: the optimizer programs a task's workspace starts from (names of
      directories ``<parents_dir>/<name>/harness.py``; None: all of them; the default
      directory: the bundled seed programs of ``benchmark=einstein``).
    seeds: the agent harnesses the methods start from (the project's seed harnesses,
      ``milo_ray/harness/seeds``); None: all of them.
    agent_time_s: the agent's wall-time cap per task; token_cap: its solver-token cap per
      task (0: none).
    memory_mb: the sandbox's memory limit (the agent's commands and the graded run).
    """

    artifact_entry = "build_agent"
    name = "einstein_agent"
    programs_field = "parents"  # the optimizer programs are the workspaces' parents

    def __init__(self, problem: str | None = None, starts: list[dict] | None = None, budget_s: float = 20.0,
                 grace_s: float = 5.0, splits: Mapping[str, Any] | None = None, split_seed: int = 0,
                 parents: list[str] | None = None, parents_dir: str | None = None, seeds: list[str] | None = None,
                 agent_time_s: float = 900.0, token_cap: int = 0, memory_mb: int = 2048):
        from milo_ray.benchmarks.harbor import seed_names

        if not _is_number(agent_time_s) or agent_time_s <= 0:
            raise ValueError(f"benchmark.agent_time_s={agent_time_s!r}: must be a positive number of seconds")
        if not _is_int(token_cap) or token_cap < 0:
            raise ValueError(f"benchmark.token_cap={token_cap!r}: must be an integer >= 0 (0: no cap)")
        if not _is_int(memory_mb) or memory_mb < 256:
            raise ValueError(f"benchmark.memory_mb={memory_mb!r}: give an integer >= 256 (numpy and scipy need "
                             "~200 MB)")
        self.agent_time_s, self.token_cap, self.memory_mb = float(agent_time_s), int(token_cap), int(memory_mb)
        self.agent_seeds = seed_names(seeds)
        super().__init__(problem=problem, starts=starts, budget_s=budget_s, grace_s=grace_s, splits=splits,
                         split_seed=split_seed, seeds=parents, seeds_dir=parents_dir)

    def _build(self, starts: list[dict] | None) -> dict[str, tuple[dict[str, Any], str]]:
        parents = self._parent_programs()
        out: dict[str, tuple[dict[str, Any], str]] = {}
        for start_id, (meta, _) in super()._build(starts).items():
            problem = meta["problem"]
            start_score = score(problem, start_values(meta["start"], problem))
            note = describe_start(problem, meta["start"])
            for name, source in parents.items():
                task_meta = {**meta, "format": "einstein_agent", "start_id": start_id, "parent": name,
                             "parent_source": source, "grace_s": self.grace_s, "memory_mb": self.memory_mb}
                out[f"{start_id}-{name}"] = (task_meta, agent_instruction(problem, note, start_score, name,
                                                                          self.budget_s, self.grace_s))
        return out

    def _parent_programs(self) -> dict[str, str]:
        return {h.name: h.files[ENTRY_FILE] for h in self.programs()}

    def _task(self, tid: str, split: str) -> Task:
        meta, text = self._built[tid]
        return Task(task_id=tid, split=split, instruction=text, time_cap_s=self.agent_time_s,
                    token_cap=self.token_cap, metadata={**meta, "start": dict(meta["start"])},
                    grading_cap_s=self.budget_s + self.grace_s + SCORING_ALLOWANCE_S + SETUP_ALLOWANCE_S,
                    format=EINSTEIN_AGENT)

    def seed_harnesses(self) -> list[Harness]:
        """The project's seed agent harnesses (``seeds``), which the methods evolve."""
        return load_seeds(self.agent_seeds)

    def unsupported_tasks(self, factory: Any) -> list[str]:
        """Why ``factory`` cannot run each task it cannot run (one line per task)."""
        from milo_ray.benchmarks.harbor import unsupported_tasks

        return unsupported_tasks(EINSTEIN_AGENT, self._by_id.values(), factory)


class EinsteinAgentFormat:
    """The :class:`~milo_ray.core.tasks.TaskFormat` of ``einstein_agent`` tasks."""

    name = "einstein_agent"

    def sandbox_spec(self, task: Task) -> SandboxSpec:
        meta = task.metadata
        files = _workspace_dir(task, runner_files(RUNNER_FILE))
        return SandboxSpec(task_id=task.task_id, workdir=WORKDIR, allow_internet=False,
                           memory_mb=int(meta.get("memory_mb", 2048)), env=interpreter_env(),
                           copy_in=((str(files), WORKDIR),), host_readonly=tuple(interpreter_paths()))

    def verify(self, task: Task, sandbox: Sandbox) -> Verdict:
        began = time.monotonic()
        meta = task.metadata
        problem, budget_s, grace_s = meta["problem"], float(meta["budget_s"]), float(meta["grace_s"])
        start = start_values(meta["start"], problem)
        start_score = score(problem, start)
        got = sandbox.download_files([f"{WORKDIR}/{PROGRAM_FILE}"])[0]
        if got.content is None:
            reason = f"no {WORKDIR}/{PROGRAM_FILE} to grade ({got.error})"
            return Verdict(score=0.0, reward={"reward": 0.0, "start_score": start_score}, output=reason,
                           seconds=time.monotonic() - began,
                           details={"problem": problem, "start_score": start_score, "score": None, "reason": reason,
                                    "values": None, "trajectory": []})
        run = run_program(sandbox, GRADE_DIR, {PROGRAM_FILE: got.content}, start, problem, PROGRAM_SEED, budget_s,
                          grace_s, entry=PROGRAM_FILE, python=sys.executable)
        graded = grade_program(problem, start, start_score, run, grace_s)
        details = {**graded.trace, "program": got.content.decode("utf-8", "replace")}
        final = graded.trace.get("score")
        reward = {"reward": graded.reward, "start_score": start_score}
        if final is not None:
            reward["score"] = float(final)
        summary = (f"graded {PROGRAM_FILE} on {problem} for {budget_s:g} s: start {start_score:.10g}, "
                   + (f"final {final:.10g}, reward {graded.reward:.4f}" if final is not None
                      else f"no gradable point: {graded.reason}")
                   + (f"; {graded.trace['stopped']}" if graded.timed_out else ""))
        tails = "\n".join(t for t in (run.stdout_tail, run.stderr_tail) if t.strip())
        return Verdict(score=graded.reward, reward=reward, output=(summary + ("\n" + tails if tails else ""))
                       [:_OUTPUT_CHARS], seconds=time.monotonic() - began, details=details)

    def solve(self, task: Task, sandbox: Sandbox) -> str | None:
        """The reference answer is the parent program as given: nothing to do."""
        return None


EINSTEIN_AGENT = EinsteinAgentFormat()


def _workspace_dir(task: Task, runner: Mapping[str, bytes]) -> Path:
    """A host directory holding the task's initial workspace (``runner``: the runner's
    files by name), written once per task and content (a worker reuses it for every
    rollout of the task)."""
    meta = task.metadata
    start = start_values(meta["start"], meta["problem"])
    buf = io.BytesIO()
    np.save(buf, start, allow_pickle=False)
    files = {START_FILE: buf.getvalue(), PROGRAM_FILE: str(meta["parent_source"]).encode(), **runner}
    digest = hashlib.sha256(b"".join(hashlib.sha256(k.encode() + v).digest() for k, v in sorted(files.items())))
    root = Path(tempfile.gettempdir()) / "milo-einstein-agent" / digest.hexdigest()[:24]
    if not root.is_dir():
        root.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=root.parent))
        for name, content in files.items():
            (staging / name).write_bytes(content)
        try:
            staging.rename(root)
        except OSError:  # another worker wrote it first: theirs has the same content
            shutil.rmtree(staging, ignore_errors=True)
    return root
