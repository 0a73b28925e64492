"""``benchmark=are``: GAIA-2-style scenarios of Meta's Agents Research Environments, read
from local scenario JSON (:mod:`.scenarios`), one task per scenario.

A rollout's task is a live world rather than a workspace, so the format is *episodic*
(:class:`~milo_ray.core.tasks.TaskEpisode`): before the agent acts, the executor starts
the scenario's host process (:mod:`.host`, under ARE's own interpreter, on the host and
never in the harness's sandbox) through :class:`AREEpisode`; the process serves the
scenario's app tools on a socket made in the rollout's own gateway directory, which only
the rollout's sandbox is shown, and the harness gets them as ``backend.task_tools``
(:mod:`milo_ray.boundary.inside.task_tools`). When the agent's processes are dead, the
episode asks ARE's judge for its verdict: ``judge=scripted`` makes no model call (ARE's
scripted judge, the offline configuration); ``judge=grader`` sends the judge's LLM checks
to the grader role. ``executor.agent=oracle`` (and ``tasks check``) replays the
scenario's oracle actions through the same tools instead of an agent.

The sandbox itself holds an empty workspace: the agent reaches the world through its
tools only. The scenario's JSON (which holds the oracle actions) stays on the host: it is
written, for the host process only, to a private directory of the rollout's episode.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any, Mapping

from milo_ray.benchmarks.are.episode import Episode, are_python, score_of
from milo_ray.benchmarks.are.scenarios import read_suite
from milo_ray.benchmarks.base import BenchmarkDataMissing, SplitTasks, seed_names
from milo_ray.benchmarks.harbor import unsupported_tasks
from milo_ray.benchmarks.splits import resolve_splits
from milo_ray.benchmarks.task_format import SETUP_ALLOWANCE_S
from milo_ray.boundary.sandbox.base import Sandbox, SandboxFactory, SandboxSpec
from milo_ray.core.problems import ExistingPath
from milo_ray.core.rollouts import InfraFailure
from milo_ray.core.tasks import Grader, Task, Verdict
from milo_ray.harness.model import Harness
from milo_ray.harness.seeds import load_seeds

JUDGES = ("scripted", "grader")
WORKDIR = "/home/user"
# ARE loads and preprocesses a scenario (an oracle run of its own) before it serves tools:
# 20-30 s on a small machine for the fixtures, more for GAIA-2's larger worlds.
READY_TIMEOUT_S = 600.0
# ARE's judge after the agent is done: one model call per LLM check with judge=grader.
JUDGE_TIMEOUT_S = 900.0


class AREBenchmark(SplitTasks):
    """ARE scenarios from local files (module docstring).

    path: a directory of scenario ``*.json`` files or one ``.jsonl`` (one scenario a line),
      as ARE exports them. judge: ``scripted`` (no model call; the offline default) or
      ``grader`` (the judge's LLM checks through ``executor.grader``). time_cap_s /
      token_cap: the agent's caps per scenario. splits / split_seed / split_file, seeds,
      skip_invalid: as the other benchmarks.
    """

    artifact_entry = "build_agent"

    def __init__(self, path: Annotated[str | None, ExistingPath('any', 'a directory of ARE scenario JSON files '
                                                                        'or one .jsonl file')] = None,
                 judge: str = "scripted", time_cap_s: float = 1800.0, token_cap: int = 2_000_000,
                 memory_mb: int = 2048, splits: Mapping[str, Any] | None = None, split_seed: int = 0,
                 split_file: str | None = None, seeds: list[str] | None = None, skip_invalid: bool = False):
        if not path:
            raise BenchmarkDataMissing("benchmark.path: no scenarios given (benchmark.path=/path/to/scenarios, a "
                                       "directory of ARE scenario *.json files or one .jsonl file)")
        root = Path(path).expanduser()
        if not root.exists():
            raise BenchmarkDataMissing(f"benchmark.path={str(path)!r}: no such file or directory")
        problems = []
        if judge not in JUDGES:
            problems.append(f"benchmark.judge={judge!r}: choose scripted (no model call) or grader (ARE's LLM "
                            "checks through executor.grader)")
        if not isinstance(time_cap_s, (int, float)) or isinstance(time_cap_s, bool) or time_cap_s <= 0:
            problems.append(f"benchmark.time_cap_s={time_cap_s!r}: a positive number of seconds")
        if isinstance(token_cap, bool) or not isinstance(token_cap, int) or token_cap <= 0:
            problems.append(f"benchmark.token_cap={token_cap!r}: a positive integer (the agent's tokens per scenario)")
        if isinstance(memory_mb, bool) or not isinstance(memory_mb, int) or memory_mb < 256:
            problems.append(f"benchmark.memory_mb={memory_mb!r}: an integer >= 256 (the sandbox's memory in MB)")
        if problems:
            raise ValueError("; ".join(problems))
        try:
            found, bad = read_suite(root)
        except ValueError as exc:
            raise BenchmarkDataMissing(f"benchmark.path: {exc}") from None
        self.invalid_tasks: dict[str, str] = {}
        if bad and not skip_invalid:
            raise ValueError(f"ARE scenarios {root}: {len(bad)} could not be read (benchmark.skip_invalid=true to "
                             "run the others):\n" + "\n".join(f"{k}: {v}" for k, v in bad.items()))
        self.invalid_tasks.update(bad)
        if not found:
            raise BenchmarkDataMissing(f"benchmark.path={str(root)!r}: no readable scenario in it")
        self.root = root.resolve()
        self.name = f"are:{self.root.name}"
        self.judge = judge
        self.seed_names = seed_names(seeds)
        fmt = ARE_GRADED if judge == "grader" else ARE
        assignment = resolve_splits(sorted(found), sizes=dict(splits.items()) if splits else None,
                                    seed=int(split_seed), split_file=split_file)
        self._splits = {
            s: [Task(task_id=sid, split=s, instruction=found[sid].first_message, time_cap_s=float(time_cap_s),
                     token_cap=int(token_cap),
                     metadata={"format": "are", "scenario": found[sid].raw, "judge": judge,
                               "user_turns": found[sid].user_turns, "oracle_actions": found[sid].oracle_actions,
                               "memory_mb": int(memory_mb), "has_solution": found[sid].oracle_actions > 0},
                     grading_cap_s=SETUP_ALLOWANCE_S + READY_TIMEOUT_S + JUDGE_TIMEOUT_S, format=fmt)
                for sid in ids]
            for s, ids in assignment.items()}
        self._by_id = {t.task_id: t for ts in self._splits.values() for t in ts}

    def seed_harnesses(self) -> list[Harness]:
        return load_seeds(self.seed_names)

    def unsupported_tasks(self, factory: SandboxFactory) -> list[str]:
        """The sandbox's objections, ARE's interpreter when there is none and bubblewrap
        when it is missing (every task needs both)."""
        out = unsupported_tasks(ARE, self._by_id.values(), factory)
        try:
            are_python()
        except FileNotFoundError as exc:
            out += [f"task {tid}: {exc}" for tid in sorted(self._by_id)]
        if shutil.which("bwrap") is None:
            out += [f"task {tid}: the scenario's world runs jailed by bubblewrap, which is not installed "
                    "(apt-get install bubblewrap)" for tid in sorted(self._by_id)]
        return out


class AREFormat:
    """The episodic :class:`~milo_ray.core.tasks.TaskFormat` of an ARE scenario (module
    docstring); :data:`ARE_GRADED` is the one whose judge asks the grader role."""

    name = "are"
    episodic = True

    def __init__(self, uses_grader: bool) -> None:
        self.uses_grader = uses_grader

    def sandbox_spec(self, task: Task) -> SandboxSpec:
        return SandboxSpec(task_id=task.task_id, workdir=WORKDIR, allow_internet=False,
                           memory_mb=int(task.metadata.get("memory_mb", 2048)))

    def start_episode(self, task: Task, socket: Path, *, oracle: bool, grader: Grader | None) -> "AREEpisode":
        return AREEpisode(task, socket, oracle=oracle, grader=grader)

    def verify(self, task: Task, sandbox: Sandbox, grader: Grader | None = None) -> Verdict:
        return Verdict(score=0.0, error="an ARE scenario is judged by its episode (start_episode), not in a sandbox")

    def evidence_files(self, verifier: Mapping[str, Any], task: Task | None = None) -> dict[str, str]:
        """What a harness's evidence adds for a scenario (:mod:`milo_ray.harness.evidence`):
        ``judged.md``, ARE's verdict with its judge's rationale and the agent's actions in
        the world, in order (the feedback this benchmark gives; never the oracle's)."""
        details = verifier.get("details") or {}
        if not details.get("scenario_id"):
            return {}
        lines = [f"# ARE judge on scenario {details['scenario_id']}", "",
                 f"verdict: {'success' if details.get('success') else 'failure'} (judge: {details.get('judge')}, "
                 f"{details.get('judge_llm_calls') or 0} LLM check(s))", ""]
        if details.get("rationale"):
            lines += ["## The judge's rationale", "", str(details["rationale"]), ""]
        if details.get("exception"):
            lines += ["## The world raised", "", str(details["exception"]), ""]
        actions = details.get("actions") or []
        lines += [f"## The agent's actions ({details.get('agent_actions') or 0} tool call(s) in the world)", ""]
        lines += [f"{i}. `{a.get('tool')}` {a.get('args')}" + (f" -- raised {a['error']}" if a.get("error") else "")
                  for i, a in enumerate(actions, 1)] or ["(none)"]
        return {"judged.md": "\n".join(lines) + "\n"}

    def solve(self, task: Task, sandbox: Sandbox) -> str | None:
        return "an ARE scenario's reference solution is its oracle episode (start_episode with oracle=True)"


ARE = AREFormat(uses_grader=False)
ARE_GRADED = AREFormat(uses_grader=True)


class AREEpisode:
    """One rollout's scenario world (:class:`~milo_ray.core.tasks.TaskEpisode`): its host
    process serving the tools at ``socket`` (``oracle``: replaying the oracle actions
    itself), the scenario JSON and the process's log in a private directory."""

    def __init__(self, task: Task, socket: Path, *, oracle: bool, grader: Grader | None,
                 python: Path | None = None) -> None:
        meta = task.metadata
        self.task_id, self.judge = task.task_id, str(meta.get("judge", "scripted"))
        self.began = time.monotonic()
        self._dir = Path(tempfile.mkdtemp(prefix="milo-are-"))  # 0700: this user's only
        scenario = self._dir / "scenario.json"
        scenario.write_text(meta["scenario"])
        self._log = self._dir / "host.log"
        try:
            self._episode = Episode(scenario, Path(socket), judge=self.judge, mode="oracle" if oracle else "agent",
                                    grader=grader, python=python, log=self._log)
        except BaseException:
            shutil.rmtree(self._dir, ignore_errors=True)
            raise
        self.ready: dict[str, Any] = {}

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        try:
            self.ready = self._episode.wait_ready(timeout_s)
        except RuntimeError as exc:
            raise RuntimeError(f"scenario {self.task_id}: {exc}{self._log_tail()}") from None

    def finish(self) -> Verdict:
        msg = self._episode.finish(JUDGE_TIMEOUT_S)
        ep = self._episode
        if ep.grader_failed:
            # The grader's endpoint failed: no verdict on the agent (retried as infrastructure).
            raise InfraFailure(f"grader model endpoint: {ep.grader_failed} of ARE's LLM checks failed after the "
                               "gateway's retries", [])
        score, error = score_of(msg)
        if error is not None:
            error = f"scenario {self.task_id}: the ARE host failed: {error}{self._log_tail()}"
        rationale = str(msg.get("rationale") or "")
        details = {"scenario_id": self.task_id, "judge": self.judge, "success": msg.get("success"),
                   "rationale": rationale, "exception": msg.get("exception"),
                   "agent_actions": msg.get("agent_actions"), "actions": msg.get("action_log") or [],
                   "judge_llm_calls": msg.get("judge_llm_calls"),
                   "grader_refused": ep.grader_refused, "setup_s": self.ready.get("setup_s"),
                   "tools": self.ready.get("tools"), "turns": self.ready.get("turns")}
        verdict_word = "success" if score == 1.0 else "failure"
        output = f"ARE judge ({self.judge}): {verdict_word}" + (f"; {rationale[:2000]}" if rationale else "")
        return Verdict(score=score, error=error, reward={"reward": score}, output=output,
                       seconds=time.monotonic() - self.began, details=details)

    def close(self) -> None:
        try:
            self._episode.close()
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)

    def _log_tail(self) -> str:
        try:
            tail = self._log.read_text(errors="replace")[-2000:]
        except OSError:
            return ""
        return f" (host log: ...{tail})" if tail.strip() else ""
