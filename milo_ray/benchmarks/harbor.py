"""Harbor task directories as a benchmark (:class:`HarborBenchmark`) and as a task
format (:data:`HARBOR`: sandbox spec, verifier, reference solution).

A suite is a directory of task directories (see :mod:`milo_ray.benchmarks.harbor_task`
for the layout and the decisions where the format is loose). Loading validates every
task and reports all problems at once. Grading follows Harbor: the task's ``tests/`` go
to ``/tests`` only after the agent finished, ``bash /tests/test.sh`` runs with the
verifier timeout, and the reward is read from ``/logs/verifier/reward.json`` (wins when
both exist) or ``/logs/verifier/reward.txt``.

Reward decisions: ``reward.json`` may be a number or a dict of numbers; the score is its
``"reward"`` key, else the mean of its numeric values when all lie in [0, 1] (per-test
sub-rewards), else an error (counts like ``{"passed": 3, "total": 5}`` are not a score).
A reward within 1e-6 outside [0, 1] is clamped, further out is an error. A verifier that
wrote no reward -- or wrote 0 while its output shows a failed fetch step or a missing
``python`` -- yields a Verdict with ``error`` saying so, so an offline environment problem
is recorded as a task error instead of passing for a wrong answer. "Needs the network" is
said only on evidence that a fetch step of the verifier's own script failed (an installer's
or downloader's own report; :mod:`milo_ray.benchmarks.network_evidence` states the rule),
never on a traceback a test prints while probing a blocked URL on purpose.

Harbor's phase contract: the verifier sees the agent phase's ``/logs/agent`` and
``/logs/artifacts`` (:data:`HarborFormat.carried_dirs`; the executor copies them out of the
agent's sandbox and shows them read-only in the grading sandbox).
"""

from __future__ import annotations

import json
import math
import re
import shlex
import time
from pathlib import Path
from typing import Annotated, Any, Mapping

from milo_ray.benchmarks.base import BenchmarkDataMissing, SplitTasks, seed_names
from milo_ray.benchmarks.harbor_task import HarborTaskSpec, parse_task_dir, resolve_env
from milo_ray.benchmarks.network_evidence import fetch_failure
from milo_ray.benchmarks.splits import resolve_splits
from milo_ray.benchmarks.task_format import SETUP_ALLOWANCE_S
from milo_ray.core.problems import ExistingPath
from milo_ray.core.tasks import Task, Verdict
from milo_ray.boundary.sandbox.base import LOGS_DIR, SOLUTION_DIR, TESTS_DIR, Sandbox, SandboxFactory, SandboxSpec
from milo_ray.boundary.shipping import ShippedTree
from milo_ray.harness.model import Harness
from milo_ray.harness.seeds import load_seeds

BUNDLED_SUITE = Path(__file__).resolve().parent.parent / "data" / "harbor_tasks"
VERIFIER_DIR = f"{LOGS_DIR}/verifier"
OUTPUT_CAP = 8000  # chars of verifier output kept in a Verdict (the tail: failures print last)
TAIL = 600  # chars of output quoted in an error message

_NO_PYTHON = re.compile(r"python: (command )?not found|'python': No such file|env: .?python.?: No such file")


def tail(text: str, n: int = TAIL) -> str:
    text = (text or "").strip()
    return text if len(text) <= n else "..." + text[-n:]


def diagnose(output: str, script: str | None = None, who: str = "the test runner", *, reported: bool = False) -> str:
    """Why a verifier's (or ``who``'s) environment, not the answer, may have failed, or ''.
    ``script``: the commands that ran, whose fetch steps alone can show that the network
    was needed (None: unknown; see :mod:`milo_ray.benchmarks.network_evidence`);
    ``reported``: the tests wrote their own report, so whatever fetch failed did not stop them."""
    notes = []
    fetch = fetch_failure(output, script, reported=reported)
    if fetch:
        notes.append(f"{who} needs the network ({fetch}; allow the task internet access or preinstall "
                     "what it fetches in the image)")
    if _NO_PYTHON.search(output or ""):
        notes.append("the verifier calls `python`, which this sandbox does not have (only python3; "
                     "use an image or host that provides `python`)")
    return "; ".join(notes)


def shell_scripts(host_dir: Path) -> str:
    """The text of every shell script under ``host_dir``: the commands whose fetch steps
    :func:`diagnose` may blame."""
    return "\n".join(p.read_text(errors="replace") for p in sorted(host_dir.rglob("*.sh")) if p.is_file())


def upload_dir(sandbox: Sandbox, host_dir: Path, target: str) -> str | None:
    """Replace ``target``'s contents with ``host_dir``'s files (executable bits kept);
    the old contents go first so nothing the agent planted survives. Error text or None."""
    files, execs = [], []
    for f in sorted(host_dir.rglob("*")):
        if f.is_file():
            dest = f"{target}/{f.relative_to(host_dir).as_posix()}"
            files.append((dest, f.read_bytes()))
            if f.stat().st_mode & 0o111:
                execs.append(dest)
    clear = sandbox.execute(f"mkdir -p {target} && find {target} -mindepth 1 -delete")
    if clear.exit_code not in (0, None):
        return f"could not clear {target}: {tail(clear.output)}"
    failed = [f"{r.path} ({r.error})" for r in sandbox.upload_files(files) if r.error]
    if failed:
        return f"could not upload to {target}: {', '.join(failed[:5])}"
    if execs:
        sandbox.execute("chmod +x " + " ".join(shlex.quote(e) for e in execs))
    return None


def exports(env: Mapping[str, str]) -> str:
    return "".join(f"export {k}={shlex.quote(v)}; " for k, v in env.items())


def _number(v: Any) -> float | None:
    if isinstance(v, (int, float)) and math.isfinite(float(v)):
        return float(v)
    return None


def _unit(x: float, what: str) -> tuple[float | None, str | None]:
    if -1e-6 <= x <= 1 + 1e-6:
        return min(1.0, max(0.0, x)), None
    return None, f"{what}={x!r} is outside [0, 1]"


def read_reward(reward_json: bytes | None, reward_txt: bytes | None) -> tuple[float | None, dict[str, float], str | None]:
    """(score, reward values, error) from the verifier's files; reward.json wins."""
    if reward_json is not None:
        try:
            data = json.loads(reward_json.decode(errors="replace"))
        except json.JSONDecodeError as e:
            return None, {}, f"reward.json is not valid JSON ({e})"
        if _number(data) is not None:
            score, err = _unit(_number(data), "reward.json")
            return score, {"reward": float(data)}, err
        if not isinstance(data, dict):
            return None, {}, f"reward.json must be a number or a dict of numbers, got {type(data).__name__}"
        values = {str(k): _number(v) for k, v in data.items() if _number(v) is not None}
        if "reward" in data:
            if _number(data["reward"]) is None:
                return None, values, f"reward.json 'reward'={data['reward']!r} is not a number"
            score, err = _unit(values["reward"], "reward.json 'reward'")
            return score, values, err
        if not values:
            return None, {}, f"reward.json has no numeric value (keys: {sorted(data)[:10]})"
        if all(0.0 <= v <= 1.0 for v in values.values()):
            return sum(values.values()) / len(values), values, None
        return None, values, (f"reward.json has no 'reward' key and its values {values} are not all in [0, 1]; "
                              "write a 'reward' key")
    if reward_txt is not None:
        text = reward_txt.decode(errors="replace").strip()
        try:
            x = float(text)
        except ValueError:
            return None, {}, f"reward.txt does not hold a number: {text[:80]!r}"
        if not math.isfinite(x):
            return None, {}, f"reward.txt={text!r} is not finite"
        score, err = _unit(x, "reward.txt")
        return score, {"reward": x}, err
    return None, {}, None


def read_verifier_files(sandbox: Sandbox) -> tuple[float | None, dict[str, float], str | None, dict | None]:
    names = ("reward.json", "reward.txt", "ctrf.json")
    got = {r.path.rsplit("/", 1)[-1]: r.content for r in sandbox.download_files([f"{VERIFIER_DIR}/{n}" for n in names])
           if r.error is None and r.content is not None}
    score, values, err = read_reward(got.get("reward.json"), got.get("reward.txt"))
    ctrf = None
    if got.get("ctrf.json") is not None:
        try:
            parsed = json.loads(got["ctrf.json"].decode(errors="replace"))
            ctrf = parsed if isinstance(parsed, dict) else None
        except json.JSONDecodeError:
            ctrf = None  # a broken report does not change the reward
    return score, values, err, ctrf


def task_root(task: Task) -> Path:
    """Where this process reads the task's files: its shipped directory unpacked in the
    node's cache (:mod:`milo_ray.boundary.shipping`), so a node that does not share the
    driver's disk runs it all the same; a task built without shipping (``files`` None)
    names paths on this machine."""
    files = task.metadata.get("files")
    if files is None:
        return Path(task.metadata["task_dir"])
    return files.local_path()


class HarborFormat:
    """The :class:`~milo_ray.core.tasks.TaskFormat` of Harbor task directories."""

    name = "harbor"
    # What Harbor's verifier sees of the agent phase besides the workspace: the agent's
    # logs and what the task asks it to publish (harbor's EnvironmentPaths). Harbor's
    # default (shared) verifier runs in the agent's own environment, where both are simply
    # there; its separate-verifier mode re-uploads /logs/artifacts through a tar filter
    # that drops special files and links leaving it. Grading here is always a fresh
    # sandbox, so both arrive as the host's copies, read-only (boundary/sandbox/carried.py).
    carried_dirs = (f"{LOGS_DIR}/agent", f"{LOGS_DIR}/artifacts")

    def sandbox_spec(self, task: Task) -> SandboxSpec:
        m = task.metadata
        env = {**m.get("dockerfile_env", {}), **resolve_env(m.get("env", {}))}
        root = task_root(task)
        context = m.get("build_context")
        return SandboxSpec(
            task_id=task.task_id, workdir=m["workdir"], allow_internet=bool(m.get("allow_internet")),
            cpus=m.get("cpus"), memory_mb=m.get("memory_mb"), storage_mb=m.get("storage_mb"), env=env,
            copy_in=tuple((str(root / h), s) for h, s in m.get("copy_in", [])),
            build_context=None if context is None else str(root / context),
            docker_image=m.get("docker_image"), needs_docker=m.get("needs_docker"))

    def verify(self, task: Task, sandbox: Sandbox) -> Verdict:
        m = task.metadata
        t0 = time.monotonic()
        timeout = float(m.get("verifier_timeout_s") or 600.0)
        # A stale or planted reward must not be read as this run's verdict.
        prep = sandbox.execute(f"rm -rf {VERIFIER_DIR} && mkdir -p {VERIFIER_DIR}")
        if prep.exit_code not in (0, None):
            return Verdict(0.0, error=f"could not prepare {VERIFIER_DIR}: {tail(prep.output)}")
        err = upload_dir(sandbox, task_root(task) / "tests", TESTS_DIR)
        if err:
            return Verdict(0.0, error=err, seconds=time.monotonic() - t0)
        try:
            env = resolve_env(m.get("verifier_env", {}))
        except ValueError as e:
            return Verdict(0.0, error=f"verifier {e}", seconds=time.monotonic() - t0)
        cmd = f"cd {shlex.quote(m['workdir'])} && {exports(env)}bash {TESTS_DIR}/test.sh"
        res = sandbox.execute(cmd, timeout=max(1, int(math.ceil(timeout))))
        elapsed = time.monotonic() - t0
        output = res.output or ""
        score, values, rerr, ctrf = read_verifier_files(sandbox)
        out_tail = output[-OUTPUT_CAP:]
        why = diagnose(output, shell_scripts(task_root(task) / "tests"), reported=ctrf is not None)
        if rerr:
            return Verdict(0.0, error=f"{rerr}; verifier output: {tail(output)}", reward=values, ctrf=ctrf,
                           output=out_tail, seconds=elapsed)
        if score is None:
            timed_out = res.exit_code == 124 or elapsed >= timeout
            reason = (f"the verifier timed out after {timeout:g}s" if timed_out
                      else f"the verifier (exit code {res.exit_code}) wrote no {VERIFIER_DIR}/reward.txt or reward.json")
            return Verdict(0.0, error="; ".join(x for x in (reason, why) if x) + f"; output: {tail(output)}",
                           ctrf=ctrf, output=out_tail, seconds=elapsed)
        if score == 0.0 and why:
            # A zero written after a failed download grades the environment, not the answer.
            return Verdict(0.0, error=f"reward 0 but {why}; output: {tail(output)}", reward=values, ctrf=ctrf,
                           output=out_tail, seconds=elapsed)
        return Verdict(score, reward=values, ctrf=ctrf, output=out_tail, seconds=elapsed)

    def solve(self, task: Task, sandbox: Sandbox) -> str | None:
        m = task.metadata
        sol = task_root(task) / "solution"
        if not (sol / "solve.sh").is_file():
            return f"task {task.task_id}: no solution/solve.sh"
        err = upload_dir(sandbox, sol, SOLUTION_DIR)
        if err:
            return f"task {task.task_id}: {err}"
        try:
            env = resolve_env(m.get("solution_env", {}))
        except ValueError as e:
            return f"task {task.task_id}: solution {e}"
        timeout = float(m.get("agent_timeout_s") or 600.0)
        cmd = f"cd {shlex.quote(m['workdir'])} && {exports(env)}bash {SOLUTION_DIR}/solve.sh"
        res = sandbox.execute(cmd, timeout=max(1, int(math.ceil(timeout))))
        if res.exit_code != 0:
            why = diagnose(res.output or "", shell_scripts(sol), who="the reference solution")
            return (f"task {task.task_id}: solve.sh exited {res.exit_code}" + (f"; {why}" if why else "")
                    + f"; output: {tail(res.output or '')}")
        return None


HARBOR = HarborFormat()


def _task_dirs(root: Path) -> list[Path]:
    """Task directories under ``root`` (or ``root`` itself when it is one task)."""
    markers = ("task.toml", "instruction.md", "tests")
    if any((root / m).exists() for m in ("task.toml", "instruction.md")):
        return [root]
    return sorted(d for d in root.iterdir()
                  if d.is_dir() and not d.name.startswith((".", "_")) and any((d / m).exists() for m in markers))


class HarborBenchmark(SplitTasks):
    """A suite of Harbor task directories.

    path: the suite directory (default: the bundled suite ``milo_ray/data/harbor_tasks``),
      or a single task directory. A task directory is a subdirectory holding task.toml,
      instruction.md or tests/; names starting with "." or "_" (e.g. ``_template``) are
      skipped. splits / split_seed / split_file: see
      :mod:`milo_ray.benchmarks.splits`. token_cap: each task's output-token cap (the
      paper's 20M). seeds: seed harness names (default all five). skip_invalid: leave
      out the tasks that have problems and list them in ``invalid_tasks`` (task id ->
      problems) instead of refusing the suite (the task check reports them as verdicts;
      a run refuses them).
    A task's time cap is its ``[agent] timeout_sec`` (600 s when absent).
    """

    def __init__(self, path: Annotated[str | None, ExistingPath('dir', 'a directory of Harbor task directories')] = None,
                 splits: Mapping[str, Any] | None = None, split_seed: int = 0,
                 split_file: Annotated[str | None, ExistingPath('file', 'a JSON/YAML file mapping split -> task ids')] = None,
                 token_cap: int = 20_000_000, seeds: list[str] | None = None,
                 skip_invalid: bool = False):
        root = Path(path).expanduser() if path else BUNDLED_SUITE
        if not root.is_dir():
            raise BenchmarkDataMissing(f"benchmark.path={str(root)!r}: no such directory "
                                       "(point it at a directory of Harbor task directories)")
        if isinstance(token_cap, bool) or not isinstance(token_cap, int) or token_cap <= 0:
            raise ValueError(f"benchmark.token_cap={token_cap!r}: must be a positive integer")
        self.root = root.resolve()
        self.name = f"harbor:{self.root.name}"
        self.token_cap = token_cap
        self.seed_names = seed_names(seeds)
        dirs = _task_dirs(self.root)
        if not dirs:
            raise BenchmarkDataMissing(f"benchmark.path={str(self.root)!r}: holds no task directory "
                                       "(each needs instruction.md, task.toml and tests/test.sh)")
        specs: list[HarborTaskSpec] = []
        problems: list[str] = []
        # Tasks left out for their problems (skip_invalid): task id -> the problems, one a line.
        self.invalid_tasks: dict[str, str] = {}
        for d in dirs:
            spec, probs = parse_task_dir(d)
            if probs and skip_invalid:
                self.invalid_tasks[spec.task_id] = "\n".join(probs)
                continue
            problems.extend(probs)
            specs.append(spec)
        if not specs:
            raise BenchmarkDataMissing(f"benchmark.path={str(self.root)!r}: no valid task directory:\n"
                                       + "\n".join(self.invalid_tasks.values()))
        if problems:
            raise ValueError(f"Harbor suite {self.root}: {len(problems)} problem(s):\n" + "\n".join(problems))
        self._specs = {s.task_id: s for s in specs}
        # Each task directory travels to the nodes as content (tests and solution too, for
        # grading there): packed now, while it is what was validated.
        self._files = {s.task_id: _pack_task(s) for s in specs}
        assignment = resolve_splits(list(self._specs), sizes=dict(splits.items()) if splits else None,
                                    seed=int(split_seed), split_file=split_file)
        self._splits = {name: [self._task(self._specs[t], name) for t in ids] for name, ids in assignment.items()}
        self._by_id = {t.task_id: t for ts in self._splits.values() for t in ts}

    def _task(self, spec: HarborTaskSpec, split: str) -> Task:
        return Task(task_id=spec.task_id, split=split, instruction=spec.instruction,
                    time_cap_s=spec.agent_timeout_s, token_cap=self.token_cap,
                    metadata=spec.metadata(self._files[spec.task_id]),
                    grading_cap_s=spec.verifier_timeout_s + SETUP_ALLOWANCE_S, format=HARBOR)

    def seed_harnesses(self) -> list[Harness]:
        return load_seeds(self.seed_names)

    def unsupported_tasks(self, factory: SandboxFactory) -> list[str]:
        """Why ``factory`` cannot run each task it cannot run (one line per task, naming
        it); empty when it can run them all. Checked before a run starts."""
        return unsupported_tasks(HARBOR, self._by_id.values(), factory)


def _pack_task(spec: HarborTaskSpec) -> ShippedTree:
    try:
        return ShippedTree.pack(spec.task_dir)
    except ValueError as exc:
        raise ValueError(f"task {spec.task_id}: {exc} (a task directory ships to the nodes as its files)") from None


def unsupported_tasks(fmt: Any, tasks: Any, factory: SandboxFactory) -> list[str]:
    out = []
    for task in tasks:
        reason = factory.unsupported(fmt.sandbox_spec(task))
        if reason:
            out.append(reason if task.task_id in reason else f"task {task.task_id}: {reason}")
    return out
