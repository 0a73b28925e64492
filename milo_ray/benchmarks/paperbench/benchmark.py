"""``benchmark=paperbench``: papers to replicate, in the upstream's per-paper layout,
graded by a rubric tree through the grader role.

A paper directory holds ``paper.md`` (and/or ``paper.pdf``), ``addendum.md``,
``rubric.json``, ``blacklist.txt``, ``config.yaml``, optionally ``judge.addendum.md`` and
``assets/``; this project also reads an optional ``reference_submission/`` (a known-good
submission, the reference solution of ``tasks check``). One task per paper.

The agent's sandbox gets the paper's public files at ``/home/paper`` (paper, addendum,
blacklist, config, assets: never ``rubric.json`` or ``judge.addendum.md``, which stay in
the task's metadata on the host) and writes its submission in ``/home/submission``
(the sandbox's workspace is ``/home``). Grading
(:class:`PaperBenchFormat.verify`) runs after the agent's processes are dead, in the
fresh grading sandbox the executor opens on the workspace: the submission is read there
(:func:`.judge.read_submission`), each leaf of the grading plan (:func:`.rubric.select`:
the mode's leaves, ``max_depth``, ``max_leaves``) gets one grader call
(:func:`.judge.grade_leaf`), and the scores are aggregated up the tree
(:func:`.rubric.aggregate`, ``judge_failures`` counting a failed leaf as 0 or dropping
it). The graded tree, the plan and the per-category subscores are the verdict's details,
kept in the rollout's trace. ``mode=full`` grades every leaf; ``reproduce=true`` (full
mode only) first runs the submission's ``reproduce.sh`` in the grading sandbox under its
own time limit (:mod:`.reproduce`: no GPU, no network), records how it ran with the tree
and shows it to the judge of Code Execution and Result Analysis leaves; without it those
leaves are judged on what the submission holds.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any, Mapping

from milo_ray.benchmarks.base import BenchmarkDataMissing, SplitTasks, seed_names
from milo_ray.benchmarks.paperbench.blacklist import violation
from milo_ray.benchmarks.paperbench.judge import SUBMISSION, grade_leaf, read_submission
from milo_ray.benchmarks.paperbench.render import graded_markdown, reproduction_summary
from milo_ray.benchmarks.paperbench.reproduce import KILL_AFTER_S, SHOWN_FOR, judge_note, run_reproduction
from milo_ray.benchmarks.paperbench.rubric import JUDGE_FAILURES, MODES, aggregate, parse_rubric, select
from milo_ray.benchmarks.splits import resolve_splits
from milo_ray.benchmarks.task_format import SETUP_ALLOWANCE_S
from milo_ray.boundary.sandbox.base import Sandbox, SandboxFactory, SandboxSpec
from milo_ray.boundary.shipping import ShippedTree
from milo_ray.core.problems import ExistingPath
from milo_ray.core.tasks import Grader, Task, Verdict
from milo_ray.harness.model import Harness
from milo_ray.harness.seeds import load_seeds

HOME = "/home"
PAPER = "/home/paper"
# What the agent may read; everything else in the paper directory is the grader's.
PUBLIC = ("paper.md", "paper.pdf", "addendum.md", "blacklist.txt", "config.yaml", "assets")
REFERENCE = "reference_submission"
# The judge's time per leaf it grades, on top of SETUP_ALLOWANCE_S (a model call).
GRADE_S_PER_LEAF = 120.0

INSTRUCTION = """Replicate the research paper in {paper}: the paper is {paper}/paper.md (or paper.pdf), with \
clarifications in {paper}/addendum.md and any files it refers to in {paper}/assets/. Write your replication as a \
git repository in {submission}, with a reproduce.sh at its root that reproduces the \
paper's results when run from there. Your submission is graded against a rubric of the paper's \
contributions.{codedev} Do not use the resources listed in {paper}/blacklist.txt (the paper's own code)."""


class PaperBenchBenchmark(SplitTasks):
    """PaperBench papers from a local folder (module docstring).

    path: a directory of paper directories (or one paper directory). mode: ``codedev``
      (Code Development leaves only, the default) or ``full``. judge_failures: ``zero``
      (a leaf the judge failed on scores 0, the upstream's rule) or ``drop`` (left out,
      the graded weight fraction reported). max_leaves: grade a seeded sample of at most
      this many leaves per paper (null: all); max_depth: grade each node at this depth as
      one requirement (null: down to the leaves) -- both bound the grader calls of a
      rollout, and both are recorded with its verdict. context_chars: what one grader
      call may read (paper excerpt, notes and ranked files). reproduce: run the
      submission's reproduce.sh in the grading sandbox before the judge (mode=full only);
      reproduce_timeout_s: its time limit, on top of the grading time. internet: give
      the agent's sandbox the filtered internet of an internet task (default: no network);
      either way the paper's blacklist is checked on what the agent did
      (:mod:`.blacklist`, :meth:`PaperBenchFormat.screen`). time_cap_s /
      token_cap: the agent's caps per paper (12 h, as the paper's setting). splits / split_seed /
      split_file, seeds: as the other benchmarks.
    """

    artifact_entry = "build_agent"

    def __init__(self, path: Annotated[str | None, ExistingPath('dir', 'a directory of PaperBench paper '
                                                                         'directories')] = None,
                 mode: str = "codedev", judge_failures: str = "zero", max_leaves: int | None = None,
                 max_depth: int | None = None, context_chars: int = 60_000, reproduce: bool = False,
                 reproduce_timeout_s: float = 3600.0, internet: bool = False, time_cap_s: float = 43_200.0,
                 token_cap: int = 20_000_000, memory_mb: int = 4096, splits: Mapping[str, Any] | None = None,
                 split_seed: int = 0, split_file: str | None = None, seeds: list[str] | None = None,
                 skip_invalid: bool = False):
        if not path:
            raise BenchmarkDataMissing("benchmark.path: no folder given (benchmark.path=/path/to/papers, a directory "
                                       "of paper directories in PaperBench's layout)")
        root = Path(path).expanduser()
        if not root.is_dir():
            raise BenchmarkDataMissing(f"benchmark.path={str(path)!r}: no such directory")
        if mode not in MODES:
            raise ValueError(f"benchmark.mode={mode!r}: choose one of {sorted(MODES)}")
        if judge_failures not in JUDGE_FAILURES:
            raise ValueError(f"benchmark.judge_failures={judge_failures!r}: choose zero (a failed leaf scores 0) or "
                             "drop (left out; the graded weight fraction is reported)")
        for name, v, low in (("max_leaves", max_leaves, 1), ("max_depth", max_depth, 0)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < low):
                raise ValueError(f"benchmark.{name}={v!r}: an integer >= {low}, or null for no cap")
        if not isinstance(reproduce, bool):
            raise ValueError(f"benchmark.reproduce={reproduce!r}: true or false")
        if reproduce and mode != "full":
            raise ValueError(f"benchmark.reproduce=true with benchmark.mode={mode}: only full mode grades the Code "
                             "Execution and Result Analysis leaves a reproduction informs; set benchmark.mode=full "
                             "or benchmark.reproduce=false")
        if (isinstance(reproduce_timeout_s, bool) or not isinstance(reproduce_timeout_s, (int, float))
                or not reproduce_timeout_s >= 1):
            raise ValueError(f"benchmark.reproduce_timeout_s={reproduce_timeout_s!r}: a number of seconds >= 1 (the "
                             "time limit of reproduce.sh)")
        if isinstance(context_chars, bool) or not isinstance(context_chars, int) or context_chars < 4000:
            raise ValueError(f"benchmark.context_chars={context_chars!r}: an integer >= 4000")
        if not isinstance(time_cap_s, (int, float)) or isinstance(time_cap_s, bool) or time_cap_s <= 0:
            raise ValueError(f"benchmark.time_cap_s={time_cap_s!r}: a positive number of seconds")
        if isinstance(token_cap, bool) or not isinstance(token_cap, int) or token_cap <= 0:
            raise ValueError(f"benchmark.token_cap={token_cap!r}: a positive integer (the agent's tokens per paper)")
        if isinstance(memory_mb, bool) or not isinstance(memory_mb, int) or memory_mb < 256:
            raise ValueError(f"benchmark.memory_mb={memory_mb!r}: an integer >= 256 (the sandbox's memory in MB)")
        self.root = root.resolve()
        self.name = f"paperbench:{self.root.name}"
        if not isinstance(internet, bool):
            raise ValueError(f"benchmark.internet={internet!r}: true (the agent's sandbox gets the filtered internet "
                             "of an internet task; the paper's blacklist is checked on what it did) or false")
        self.internet = internet
        self.options = {"mode": mode, "judge_failures": judge_failures, "max_leaves": max_leaves,
                        "max_depth": max_depth, "context_chars": int(context_chars), "reproduce": reproduce,
                        "reproduce_timeout_s": float(reproduce_timeout_s)}
        self.time_cap_s, self.token_cap, self.memory_mb = float(time_cap_s), int(token_cap), int(memory_mb)
        self.seed_names = seed_names(seeds)
        dirs = [self.root] if (self.root / "rubric.json").is_file() else sorted(
            d for d in self.root.iterdir() if d.is_dir() and (d / "rubric.json").is_file())
        if not dirs:
            raise BenchmarkDataMissing(f"benchmark.path={str(self.root)!r}: no paper directory (one with a "
                                       "rubric.json) in it")
        metas, problems = {}, []
        self.invalid_tasks: dict[str, str] = {}
        for d in dirs:
            try:
                metas[d.name] = self._paper(d)
            except ValueError as exc:
                if skip_invalid:
                    self.invalid_tasks[d.name] = str(exc)
                else:
                    problems.append(f"{d.name}: {exc}")
        if problems:
            raise ValueError(f"PaperBench folder {self.root}: {len(problems)} problem(s):\n" + "\n".join(problems))
        assignment = resolve_splits(list(metas), sizes=dict(splits.items()) if splits else None,
                                    seed=int(split_seed), split_file=split_file)
        self._splits = {s: [self._task(metas[t], t, s) for t in ids] for s, ids in assignment.items()}
        self._by_id = {t.task_id: t for ts in self._splits.values() for t in ts}

    def _paper(self, d: Path) -> dict[str, Any]:
        if not (d / "paper.md").is_file() and not (d / "paper.pdf").is_file():
            raise ValueError("no paper.md or paper.pdf")
        try:
            rubric = json.loads((d / "rubric.json").read_text())
        except ValueError as exc:
            raise ValueError(f"rubric.json: not valid JSON ({exc})") from None
        tree = parse_rubric(rubric)
        plan = select(tree, mode=self.options["mode"], max_depth=self.options["max_depth"],
                      max_leaves=self.options["max_leaves"], seed=d.name)
        if plan.tree is None:
            raise ValueError(f"rubric.json: no leaf of the categories mode={self.options['mode']} grades")
        # The agent's /home: the paper's public files and an empty submission directory.
        public = {f"paper/{name}": d / name for name in PUBLIC if (d / name).exists()}
        public["submission"] = _empty_dir()
        ref = d / REFERENCE
        text = lambda name: (d / name).read_text(errors="replace") if (d / name).is_file() else ""  # noqa: E731
        return {"format": "paperbench", "paper_id": d.name, "rubric": rubric, **self.options,
                "paper_text": text("paper.md"), "addendum": text("addendum.md"),
                "judge_addendum": text("judge.addendum.md"),
                "blacklist": [ln.strip() for ln in text("blacklist.txt").splitlines() if ln.strip()],
                "leaves_graded": len(plan.sampled), "files": ShippedTree.pack(public),
                "reference": ShippedTree.pack(ref) if ref.is_dir() else None, "has_solution": ref.is_dir(),
                "solution_layout": f"{REFERENCE}/ in the paper's directory"}

    def _task(self, meta: dict[str, Any], tid: str, split: str) -> Task:
        if meta["mode"] == "codedev":
            codedev = " Only its code development requirements are graded (reproduce.sh is not run)."
        elif meta["reproduce"]:
            codedev = (f" Before grading, reproduce.sh is run from {SUBMISSION} in a fresh sandbox without network "
                       f"or GPU, for at most {meta['reproduce_timeout_s']:.0f} s; what it prints and writes is "
                       "graded with the rest.")
        else:
            codedev = (" Every requirement is judged on what the submission holds (reproduce.sh is not run: leave "
                       "its outputs in the submission).")
        reproduce_s = meta["reproduce_timeout_s"] + KILL_AFTER_S if meta["reproduce"] else 0.0
        return Task(task_id=tid, split=split, instruction=INSTRUCTION.format(paper=PAPER, submission=SUBMISSION,
                                                                             codedev=codedev),
                    time_cap_s=self.time_cap_s, token_cap=self.token_cap,
                    metadata={**meta, "memory_mb": self.memory_mb, "internet": self.internet},
                    grading_cap_s=SETUP_ALLOWANCE_S + reproduce_s + GRADE_S_PER_LEAF * meta["leaves_graded"],
                    format=PAPERBENCH)

    def seed_harnesses(self) -> list[Harness]:
        return load_seeds(self.seed_names)

    def unsupported_tasks(self, factory: SandboxFactory) -> list[str]:
        from milo_ray.benchmarks.harbor import unsupported_tasks

        return unsupported_tasks(PAPERBENCH, self._by_id.values(), factory)


class PaperBenchFormat:
    """The :class:`~milo_ray.core.tasks.TaskFormat` of a paper: it asks for the grader role."""

    name = "paperbench"
    uses_grader = True

    def sandbox_spec(self, task: Task) -> SandboxSpec:
        meta = task.metadata
        # The workspace is /home (paper/ and submission/): a sandbox's copies go under its
        # writable directories, and grading moves the whole workspace to a fresh sandbox.
        return SandboxSpec(task_id=task.task_id, workdir=HOME, allow_internet=bool(meta.get("internet", False)),
                           memory_mb=int(meta.get("memory_mb", 4096)),
                           copy_in=((str(meta["files"].local_path()), HOME),))

    def verify(self, task: Task, sandbox: Sandbox, grader: Grader | None = None) -> Verdict:
        began = time.monotonic()
        meta = task.metadata
        if grader is None:
            return Verdict(score=0.0, error="paperbench needs the grader role (executor.grader)",
                           seconds=time.monotonic() - began)
        plan = select(parse_rubric(meta["rubric"]), mode=meta["mode"], max_depth=meta["max_depth"],
                      max_leaves=meta["max_leaves"], seed=meta["paper_id"])
        # Before the submission is read: the judge reads what the reproduction wrote.
        rep = run_reproduction(sandbox, meta["reproduce_timeout_s"]) if meta.get("reproduce") else None
        note = judge_note(rep) if rep is not None else ""
        files, read = read_submission(sandbox)
        paper = meta["paper_text"] + ("\n\nAddendum:\n" + meta["addendum"] if meta["addendum"] else "")
        leaves = {lf.id: lf for lf in plan.tree.leaves()}
        verdicts = {lid: grade_leaf(grader, leaves[lid], paper=paper, judge_notes=meta["judge_addendum"], files=files,
                                    context_chars=meta["context_chars"],
                                    reproduction=note if leaves[lid].category in SHOWN_FOR else "")
                    for lid in plan.sampled}
        graded = aggregate(plan.tree, verdicts, judge_failures=meta["judge_failures"])
        failed = sum(1 for v in verdicts.values() if v.get("error"))
        details = {"plan": plan.record(), "submission": read, "judge_failed_leaves": failed, **graded,
                   **({"reproduction": rep} if rep is not None else {})}
        summary = (f"rubric score {graded['score']:.3f} ({meta['mode']}, {len(verdicts)} leaves graded, {failed} judge "
                   f"failure(s) counted as {meta['judge_failures']}, graded weight fraction "
                   f"{graded['graded_weight_fraction']:.3f}); per category: "
                   + ", ".join(f"{k} {v:.3f}" for k, v in graded["categories"].items() if v is not None)
                   + (f"; reproduce.sh: {reproduction_summary(rep)}" if rep is not None else ""))
        return Verdict(score=graded["score"], reward={"reward": graded["score"],
                                                      "graded_weight_fraction": graded["graded_weight_fraction"]},
                       output=summary, seconds=time.monotonic() - began, details=details)

    def evidence_files(self, verifier: Mapping[str, Any], task: Task | None = None) -> dict[str, str]:
        """What a harness's evidence adds for a paper (:mod:`milo_ray.harness.evidence`):
        ``graded.md``, every rubric leaf with its verdict and the grader's reason."""
        text = graded_markdown(verifier, task_id=task.task_id if task is not None else "")
        return {"graded.md": text} if text else {}

    def screen(self, task: Task, steps: list[dict[str, Any]]) -> str | None:
        """The paper's blacklist, checked on what the agent did (:mod:`.blacklist`): the
        reason its attempt is void, or None."""
        return violation(task.metadata.get("blacklist") or [], steps)

    def solve(self, task: Task, sandbox: Sandbox) -> str | None:
        ref = task.metadata.get("reference")
        if ref is None:
            return f"paper {task.task_id}: no {REFERENCE}/ (the upstream ships no reference submission)"
        root = ref.local_path()
        files = [(f"{SUBMISSION}/{p.relative_to(root)}", p.read_bytes()) for p in sorted(root.rglob("*"))
                 if p.is_file() and not p.is_symlink()]
        bad = [r.error for r in sandbox.upload_files(files) if getattr(r, "error", None)]
        return f"could not write the reference submission: {bad[0]}" if bad else None


PAPERBENCH = PaperBenchFormat()


def _empty_dir() -> Path:
    import tempfile

    global _EMPTY
    if _EMPTY is None or not _EMPTY.is_dir():
        _EMPTY = Path(tempfile.mkdtemp(prefix="milo-paperbench-empty-"))
    return _EMPTY


_EMPTY: Path | None = None
