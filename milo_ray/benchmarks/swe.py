"""SWE-style JSONL task sets (SWE-bench, SWE-bench Pro, SWE-rebench) as a benchmark
(:class:`SweBenchmark`) and a task format (:data:`SWE`).

One row per task: ``instance_id``, ``repo``, ``base_commit``, ``problem_statement``, the
tests ``FAIL_TO_PASS`` / ``PASS_TO_PASS`` (or lowercase; a list or a JSON string of a
list), optional ``patch`` (gold) and ``test_patch``. The image comes from ``image_name``,
``docker_image`` or ``dockerhub_tag`` (else the ``image_template`` config); the test
command from the row's ``install_config.test_cmd`` (else the ``test_cmd`` config); the
repository sits at the row's ``workdir`` (else the config's, default ``/testbed``).

Grading (:meth:`SweFormat.verify`): the agent's edits are in the working tree. The test
files the ``test_patch`` touches are reset to ``base_commit`` and the patch applied (the
agent must not grade itself with its own tests), then ``<test_cmd> <listed tests>`` runs.
Its output is parsed as pytest's: ``-rA`` summary lines (``PASSED id``, ``FAILED id - msg``,
``ERROR id``, ``XFAIL``/``XPASS``/``SKIPPED``) and verbose lines (``id PASSED [ 50%]``);
PASSED and XFAIL count as passing. The score is the fraction of FAIL_TO_PASS +
PASS_TO_PASS tests that passed; a listed test absent from the output failed. Frameworks
with other output (Django's runner, Jest, Go) are not parsed: such rows grade as errors
("no test results parsed") until a per-repo log parser is added.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import time
from pathlib import Path
from typing import Annotated, Any, Mapping

from milo_ray.benchmarks.base import BenchmarkDataMissing, SplitTasks
from milo_ray.benchmarks.harbor import OUTPUT_CAP, diagnose, seed_names, tail, unsupported_tasks
from milo_ray.benchmarks.splits import resolve_splits
from milo_ray.benchmarks.task_format import SETUP_ALLOWANCE_S
from milo_ray.core.problems import ExistingPath
from milo_ray.core.tasks import Task, Verdict
from milo_ray.boundary.sandbox.base import SOLUTION_DIR, TESTS_DIR, Sandbox, SandboxFactory, SandboxSpec
from milo_ray.harness.model import Harness
from milo_ray.harness.seeds import load_seeds

_STATUSES = ("PASSED", "FAILED", "ERROR", "XFAIL", "XPASS", "SKIPPED")
_PASSING = {"PASSED", "XFAIL"}
_SUMMARY = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED) (.+?)(?: - .*)?$")
_VERBOSE = re.compile(r"^(\S+::\S.*?) (PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED)(?: +\[ *\d+%\])?$")


def parse_pytest_log(output: str) -> dict[str, str]:
    """test id -> status from pytest output (``-rA`` summary or ``-v`` lines). When a test
    appears twice (verbose line and summary), the summary line, printed last, wins."""
    results: dict[str, str] = {}
    for raw in output.splitlines():
        line = raw.strip()
        m = _SUMMARY.match(line)
        if m:
            results[m.group(2).strip()] = m.group(1)
            continue
        m = _VERBOSE.match(line)
        if m:
            results[m.group(1).strip()] = m.group(2)
    return results


def _test_list(row: dict, key: str) -> tuple[list[str] | None, str | None]:
    value = row.get(key.upper(), row.get(key.lower()))
    if value is None:
        return [], None
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except json.JSONDecodeError:
            return None, f"{key.upper()} is a string but not a JSON list"
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        return None, f"{key.upper()} must be a list of test ids (or a JSON string of one)"
    return value, None


def _row_image(row: dict, image_template: str | None) -> str | None:
    for key in ("image_name", "docker_image"):
        if isinstance(row.get(key), str) and row[key].strip():
            return row[key].strip()
    tag = row.get("dockerhub_tag")
    fields = {"instance_id": row.get("instance_id", ""), "repo": row.get("repo", ""),
              "dockerhub_tag": tag or "", "instance_id_docker": str(row.get("instance_id", "")).replace("__", "_1776_")}
    if image_template:
        return image_template.format(**fields)
    if isinstance(tag, str) and tag.strip():
        return tag.strip()
    return None


def parse_row(row: Any, lineno: int, *, test_cmd: str | None, workdir: str, image_template: str | None,
              verifier_timeout_s: float) -> tuple[dict[str, Any] | None, list[str]]:
    """(metadata, problems) of one JSONL row; problems name the line and the field."""
    if not isinstance(row, dict):
        return None, [f"line {lineno}: not a JSON object"]
    iid = row.get("instance_id")
    at = f"line {lineno} ({iid})" if isinstance(iid, str) else f"line {lineno}"
    problems = []
    for key in ("instance_id", "repo", "base_commit", "problem_statement"):
        if not isinstance(row.get(key), str) or not row[key].strip():
            problems.append(f"{at}: {key} is missing or empty")
    f2p, e1 = _test_list(row, "fail_to_pass")
    p2p, e2 = _test_list(row, "pass_to_pass")
    problems += [f"{at}: {e}" for e in (e1, e2) if e]
    if f2p is not None and p2p is not None and not f2p + p2p:
        problems.append(f"{at}: FAIL_TO_PASS and PASS_TO_PASS are both empty; nothing to grade")
    image = _row_image(row, image_template)
    if image is None:
        problems.append(f"{at}: no image_name, docker_image or dockerhub_tag; set benchmark.image_template "
                        "(e.g. 'swebench/sweb.eval.x86_64.{instance_id_docker}:latest')")
    install = row.get("install_config")
    if isinstance(install, str):
        try:
            install = json.loads(install)
        except json.JSONDecodeError:
            install = None
    cmd = install.get("test_cmd") if isinstance(install, dict) else None
    if isinstance(cmd, list):
        cmd = " && ".join(str(c) for c in cmd)
    cmd = cmd or test_cmd
    if not cmd:
        problems.append(f"{at}: no install_config.test_cmd; set benchmark.test_cmd (e.g. 'pytest -rA --tb=no')")
    wd = row.get("workdir") or workdir
    if not isinstance(wd, str) or not wd.startswith("/"):
        problems.append(f"{at}: workdir {wd!r} must be an absolute path")
    for key in ("patch", "test_patch"):
        if row.get(key) is not None and not isinstance(row[key], str):
            problems.append(f"{at}: {key} must be a diff string")
    if problems:
        return None, problems
    return {
        "format": "swe", "instance_id": iid, "repo": row["repo"], "base_commit": row["base_commit"],
        "fail_to_pass": f2p, "pass_to_pass": p2p, "docker_image": image, "test_cmd": cmd, "workdir": wd,
        "patch": row.get("patch") or None, "test_patch": row.get("test_patch") or None,
        "verifier_timeout_s": float(verifier_timeout_s), "has_solution": bool(row.get("patch")),
        "problem_statement": row["problem_statement"],
    }, []


def _patched_files(diff: str) -> list[str]:
    return list(dict.fromkeys(m.group(1) for m in re.finditer(r"^diff --git a/(\S+) b/", diff, re.M)))


class SweFormat:
    """The :class:`~milo_ray.core.tasks.TaskFormat` of SWE-style rows."""

    name = "swe"

    def sandbox_spec(self, task: Task) -> SandboxSpec:
        m = task.metadata
        return SandboxSpec(task_id=task.task_id, workdir=m["workdir"], allow_internet=bool(m.get("allow_internet")),
                           docker_image=m["docker_image"],
                           needs_docker=f"runs in its prebuilt image {m['docker_image']} (the repository lives there)")

    def verify(self, task: Task, sandbox: Sandbox) -> Verdict:
        m = task.metadata
        t0 = time.monotonic()
        wd = shlex.quote(m["workdir"])
        if m.get("test_patch"):
            files = _patched_files(m["test_patch"])
            reset = " ".join(f"(git checkout -q {shlex.quote(m['base_commit'])} -- {shlex.quote(f)} 2>/dev/null "
                             f"|| rm -f {shlex.quote(f)});" for f in files)
            up = sandbox.upload_files([(f"{TESTS_DIR}/test.patch", m["test_patch"].encode())])
            if any(r.error for r in up):
                return Verdict(0.0, error=f"could not upload the test patch: {up[0].error}")
            res = sandbox.execute(f"cd {wd} && {reset} git apply --whitespace=nowarn {TESTS_DIR}/test.patch")
            if res.exit_code != 0:
                return Verdict(0.0, error=f"test_patch does not apply: {tail(res.output)}",
                               seconds=time.monotonic() - t0)
        listed = list(dict.fromkeys(m["fail_to_pass"] + m["pass_to_pass"]))
        timeout = float(m.get("verifier_timeout_s") or 1800.0)
        cmd = f"cd {wd} && {m['test_cmd']} " + " ".join(shlex.quote(t) for t in listed)
        res = sandbox.execute(cmd, timeout=max(1, int(math.ceil(timeout))))
        output = res.output or ""
        seconds = time.monotonic() - t0
        results = parse_pytest_log(output)
        if not results:
            why = diagnose(output)
            return Verdict(0.0, error="; ".join(x for x in (
                f"no test results parsed from the test command's output (exit code {res.exit_code}; only pytest "
                "-rA/-v output is read)", why) if x) + f"; output: {tail(output)}",
                output=output[-OUTPUT_CAP:], seconds=seconds)
        statuses = {t: results.get(t, "MISSING") for t in listed}
        passed = [t for t, s in statuses.items() if s in _PASSING]
        f2p_ok = sum(statuses[t] in _PASSING for t in m["fail_to_pass"])
        score = len(passed) / len(listed)
        ctrf = {"results": {
            "tool": {"name": "pytest"},
            "summary": {"tests": len(listed), "passed": len(passed),
                        "failed": sum(s in ("FAILED", "ERROR", "XPASS") for s in statuses.values()),
                        "skipped": sum(s == "SKIPPED" for s in statuses.values()),
                        "other": sum(s == "MISSING" for s in statuses.values())},
            "tests": [{"name": t, "status": _ctrf_status(s), "raw_status": s,
                       "suite": "FAIL_TO_PASS" if t in m["fail_to_pass"] else "PASS_TO_PASS"}
                      for t, s in statuses.items()]}}
        reward = {"reward": score, "fail_to_pass": f2p_ok / max(1, len(m["fail_to_pass"])),
                  "pass_to_pass": (sum(statuses[t] in _PASSING for t in m["pass_to_pass"])
                                   / max(1, len(m["pass_to_pass"])))}
        return Verdict(score, reward=reward, ctrf=ctrf, output=output[-OUTPUT_CAP:], seconds=seconds)

    def solve(self, task: Task, sandbox: Sandbox) -> str | None:
        patch = task.metadata.get("patch")
        if not patch:
            return f"task {task.task_id}: the row has no gold patch"
        up = sandbox.upload_files([(f"{SOLUTION_DIR}/gold.patch", patch.encode())])
        if any(r.error for r in up):
            return f"task {task.task_id}: could not upload the gold patch ({up[0].error})"
        res = sandbox.execute(f"cd {shlex.quote(task.metadata['workdir'])} && "
                              f"git apply --whitespace=nowarn {SOLUTION_DIR}/gold.patch")
        if res.exit_code != 0:
            return f"task {task.task_id}: the gold patch does not apply: {tail(res.output)}"
        return None


def _ctrf_status(s: str) -> str:
    return {"PASSED": "passed", "XFAIL": "passed", "FAILED": "failed", "ERROR": "failed", "XPASS": "failed",
            "SKIPPED": "skipped"}.get(s, "other")


SWE = SweFormat()


class SweBenchmark(SplitTasks):
    """A JSONL file of SWE-style rows.

    path: the JSONL file. splits / split_seed / split_file: see
    :mod:`milo_ray.benchmarks.splits`. test_cmd: the test command for rows without
    ``install_config.test_cmd`` (its output must be pytest's, with ``-rA``). workdir: where
    the repository sits in the image for rows that do not say. image_template: image for
    rows without one (``{instance_id}``, ``{instance_id_docker}``, ``{repo}``,
    ``{dockerhub_tag}``). time_cap_s: the agent's time cap per task (the paper's 7,200 s).
    verifier_timeout_s: the test command's timeout. token_cap: output-token cap per task.
    seeds: seed harness names (default all five). skip_invalid: leave out the rows that
    have problems and list them in ``invalid_tasks`` (instance id, or ``line N`` for a row
    without one -> problems) instead of refusing the file.
    """

    def __init__(self, path: Annotated[str | None, ExistingPath('file', 'a JSONL file of SWE rows')] = None,
                 splits: Mapping[str, Any] | None = None, split_seed: int = 0,
                 split_file: Annotated[str | None, ExistingPath('file', 'a JSON/YAML file mapping split -> task ids')] = None,
                 test_cmd: str | None = None, workdir: str = "/testbed",
                 image_template: str | None = None, time_cap_s: float = 7200.0, verifier_timeout_s: float = 1800.0,
                 token_cap: int = 20_000_000, seeds: list[str] | None = None, skip_invalid: bool = False):
        if not path:
            raise BenchmarkDataMissing("benchmark.path: no JSONL file given (benchmark.path=/path/to/tasks.jsonl)")
        p = Path(path).expanduser()
        if not p.is_file():
            raise BenchmarkDataMissing(f"benchmark.path={str(path)!r}: no such file (give a JSONL file of SWE rows)")
        for name, v in (("time_cap_s", time_cap_s), ("verifier_timeout_s", verifier_timeout_s)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"benchmark.{name}={v!r}: must be a positive number of seconds")
        if isinstance(token_cap, bool) or not isinstance(token_cap, int) or token_cap <= 0:
            raise ValueError(f"benchmark.token_cap={token_cap!r}: must be a positive integer")
        self.path = p.resolve()
        self.name = f"swe:{self.path.stem}"
        self.token_cap, self.time_cap_s = token_cap, float(time_cap_s)
        self.seed_names = seed_names(seeds)
        metas: dict[str, dict[str, Any]] = {}
        seen: dict[str, int] = {}
        problems: list[str] = []
        # Rows left out for their problems (skip_invalid): instance id (or "line N") -> problems.
        self.invalid_tasks: dict[str, str] = {}
        for lineno, line in enumerate(self.path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                problems.append(f"line {lineno}: not valid JSON ({e.msg})")
                continue
            meta, probs = parse_row(row, lineno, test_cmd=test_cmd, workdir=workdir, image_template=image_template,
                                    verifier_timeout_s=verifier_timeout_s)
            iid = row.get("instance_id") if isinstance(row, dict) else None
            if isinstance(iid, str):
                if iid in seen:
                    probs.append(f"line {lineno} ({iid}): instance_id {iid!r} appears twice (first on line {seen[iid]})")
                seen.setdefault(iid, lineno)
            if probs and skip_invalid:
                key = iid if isinstance(iid, str) and iid.strip() and iid not in metas else f"line {lineno}"
                self.invalid_tasks[key] = "\n".join(probs)
                continue
            problems += probs
            if meta is not None:
                metas[meta["instance_id"]] = meta
        if problems:
            raise ValueError(f"SWE task file {self.path}: {len(problems)} problem(s):\n" + "\n".join(problems))
        if not metas:
            raise BenchmarkDataMissing(f"benchmark.path={str(self.path)!r}: holds no valid rows"
                                       + "".join(f"\n{v}" for v in self.invalid_tasks.values()))
        assignment = resolve_splits(list(metas), sizes=dict(splits.items()) if splits else None,
                                    seed=int(split_seed), split_file=split_file)
        self._splits = {name: [self._task(metas[t], name) for t in ids] for name, ids in assignment.items()}
        self._by_id = {t.task_id: t for ts in self._splits.values() for t in ts}

    def _task(self, meta: dict[str, Any], split: str) -> Task:
        meta = dict(meta)
        instruction = meta.pop("problem_statement")
        return Task(task_id=meta["instance_id"], split=split, instruction=instruction, time_cap_s=self.time_cap_s,
                    token_cap=self.token_cap, metadata=meta,
                    grading_cap_s=float(meta["verifier_timeout_s"]) + SETUP_ALLOWANCE_S, format=SWE)

    def seed_harnesses(self) -> list[Harness]:
        return load_seeds(self.seed_names)

    def unsupported_tasks(self, factory: SandboxFactory) -> list[str]:
        """Why ``factory`` cannot run each task it cannot run (one line per task)."""
        return unsupported_tasks(SWE, self._by_id.values(), factory)
