"""One verdict per task from what the check found: a pure decision, no I/O.

The verdicts, in the order they are decided (the first that applies wins):

* ``unrunnable`` -- the task cannot be run as configured (a format problem, no reference
  solution to validate it with, an image missing from the Docker host, a sandbox that
  refuses it for a reason other than Docker, or an infrastructure failure that survived
  the scheduler's retries);
* ``needs-docker`` -- its environment changes the image (RUN steps, a prebuilt image)
  and the sandbox is not Docker;
* ``flaky`` -- the reference solution scored differently across ``--repeat`` runs;
* ``needs-network`` -- the reference solution scored below 1 and its error says a fetch
  step of the verifier's (or the solution's) own script failed to download
  (:mod:`milo_ray.benchmarks.network_evidence`: an installer's or downloader's own report,
  never a traceback a test prints while probing a blocked URL on purpose). A script that
  merely has a fetch step (the static hint) is a note, not this verdict: the check ran
  it, and only its output shows whether the fetch failed;
* ``broken`` -- the reference solution scored below 1 (the reason says why: the gold
  patch did not apply, solve.sh failed, the verifier wrote no reward, or its score);
* ``trivial`` -- doing nothing already scores 1, so the task measures nothing;
* ``ok`` -- the reference solution scores 1 and doing nothing scores below 1.

A verifier that installs its test runner from the network but passes offline (the
package was there already) is ``ok``: what decides is whether it works here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

OK, TRIVIAL, BROKEN, FLAKY = "ok", "trivial", "broken", "flaky"
NEEDS_NETWORK, NEEDS_DOCKER, UNRUNNABLE = "needs-network", "needs-docker", "unrunnable"
VERDICTS = (OK, TRIVIAL, BROKEN, FLAKY, NEEDS_NETWORK, NEEDS_DOCKER, UNRUNNABLE)


@dataclass(frozen=True)
class StaticFindings:
    """What was found without running the task. ``blocker``: (verdict, reason) when it
    cannot run at all (``unrunnable`` or ``needs-docker``); ``network_hint``: the verifier
    script's fetch step, kept as a note ('' when it has none)."""

    blocker: tuple[str, str] | None = None
    network_hint: str = ""


@dataclass(frozen=True)
class Graded:
    """One graded rollout: its score, its error text, and its error kind (None, task,
    harness, infra)."""

    score: float
    error: str | None = None
    error_kind: str | None = None


@dataclass(frozen=True)
class TaskVerdict:
    task_id: str
    verdict: str
    reason: str
    oracle_scores: tuple[float, ...] = ()
    noop_score: float | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)


def _network_in(error: str | None) -> bool:
    # The wording of milo_ray.benchmarks.harbor.diagnose, which every real format's
    # verifier and solution errors carry; looked for only in what the framework wrote, the
    # text before each quoted output (the solution's, then the verifier's after
    # "; verifier: "): what a test prints could say anything.
    if not error:
        return False
    return any("needs the network (" in part.split("output: ", 1)[0] for part in error.split("; verifier: "))


def _fmt(x: float) -> str:
    return f"{x:.3g}"


def decide(task_id: str, static: StaticFindings, oracle: Sequence[Graded] = (),
           noop: Graded | None = None) -> TaskVerdict:
    """The verdict of one task (module docstring: the order and the rules)."""
    if static.blocker is not None:
        verdict, reason = static.blocker
        return TaskVerdict(task_id, verdict, reason)
    scores = tuple(float(g.score) for g in oracle)
    noop_score = None if noop is None else float(noop.score)
    notes = (f"static: {static.network_hint}",) if static.network_hint else ()

    def verdict(v: str, reason: str) -> TaskVerdict:
        return TaskVerdict(task_id, v, reason, scores, noop_score, notes)

    infra = next((g for g in [*oracle, *([noop] if noop else [])] if g.error_kind == "infra"), None)
    if infra is not None:
        return verdict(UNRUNNABLE, f"infrastructure failure after retries: {infra.error}")
    if not oracle:
        return verdict(UNRUNNABLE, "the reference solution did not run")
    if len(set(scores)) > 1:
        return verdict(FLAKY, f"the reference solution scored {', '.join(map(_fmt, scores))} across "
                              f"{len(scores)} runs of the same workspace")
    if scores[0] < 1.0:
        failed = next((g for g in oracle if g.error), None)
        why = failed.error if failed else f"the verifier scored the reference solution {_fmt(scores[0])}"
        if any(_network_in(g.error) for g in oracle):
            return verdict(NEEDS_NETWORK, why)
        return verdict(BROKEN, why)
    if noop_score is not None and noop_score >= 1.0:
        return verdict(TRIVIAL, "doing nothing already scores 1: the task measures nothing")
    if noop is None:
        return verdict(OK, "the reference solution scores 1 (the do-nothing agent was not run)")
    return verdict(OK, f"the reference solution scores 1, doing nothing {_fmt(noop_score)}")
