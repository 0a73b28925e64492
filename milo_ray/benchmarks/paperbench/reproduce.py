"""Running a submission's ``reproduce.sh`` before it is judged (``benchmark.reproduce=true``,
``mode=full``), as the upstream's full PaperBench does: in the fresh grading sandbox (the
agent's processes dead; no network), from the submission's root, under its own time limit
(``benchmark.reproduce_timeout_s``), its output written to ``reproduce.log`` at the
submission's root (replacing any the agent left), so the judge reads what the run
produced (its log, the files it wrote) with the rest of the submission.

What it returns is kept with the graded tree (``details["reproduction"]``) and shown to
the judge for the leaves about running the code and its results
(:func:`judge_note`). The script is untrusted code in the sandbox like the agent's: the
host only starts it and reads its exit status and the log's tail through the sandbox.
"""

from __future__ import annotations

import re
import shlex
import time
from typing import Any

from milo_ray.benchmarks.paperbench.judge import SUBMISSION

LOG = "reproduce.log"
LOG_TAIL_CHARS = 4000
# Grace after the time limit's TERM before timeout(1) sends KILL to the script's process group.
KILL_AFTER_S = 10
# Leaf categories whose judge is shown how reproduce.sh ran.
SHOWN_FOR = ("Code Execution", "Result Analysis", "mixed")
_EXIT = re.compile(r"^__milo_reproduce_exit=(\d+)$")


def run_reproduction(sandbox: Any, timeout_s: float) -> dict[str, Any]:
    """Run ``reproduce.sh`` in ``sandbox`` (module docstring). Returns ``ran`` (False: no
    script), ``exit_code`` (None when it did not run), ``timed_out``, ``seconds`` (wall
    time, the sandbox call included), ``timeout_s`` and ``log_tail`` (its last
    :data:`LOG_TAIL_CHARS` characters of output), or ``error`` saying why it did not run."""
    limit = max(1, int(timeout_s))
    began = time.monotonic()
    # The exit marker is printed by the outer shell before the log's tail, on the first
    # line: the script's own output cannot forge it (it goes to the log file).
    cmd = (f"cd {shlex.quote(SUBMISSION)} 2>/dev/null || {{ echo __milo_reproduce_missing=submission; exit 0; }}; "
           f"[ -f reproduce.sh ] || {{ echo __milo_reproduce_missing=reproduce.sh; exit 0; }}; "
           f"rm -f {LOG}; timeout -k {KILL_AFTER_S} {limit} bash reproduce.sh > {LOG} 2>&1 < /dev/null; "
           f"echo __milo_reproduce_exit=$?; tail -c {LOG_TAIL_CHARS} {LOG}")
    res = sandbox.execute(cmd, timeout=limit + KILL_AFTER_S + 30)
    seconds = round(time.monotonic() - began, 3)
    out = getattr(res, "output", "") or ""
    first, _, tail = out.partition("\n")
    base = {"timeout_s": float(timeout_s), "seconds": seconds}
    if first.startswith("__milo_reproduce_missing="):
        what = first.split("=", 1)[1]
        return {**base, "ran": False, "exit_code": None, "timed_out": False, "log_tail": "",
                "error": f"no {what} at {SUBMISSION}" if what != "submission" else f"no {SUBMISSION}"}
    m = _EXIT.match(first.strip())
    if m is None:  # the sandbox call itself failed or was cut (its own timeout)
        return {**base, "ran": True, "exit_code": None, "timed_out": True, "log_tail": out[-LOG_TAIL_CHARS:],
                "error": f"the sandbox did not report reproduce.sh's exit (exit {getattr(res, 'exit_code', None)})"}
    code = int(m.group(1))
    # timeout(1): 124 when the limit's TERM ended it, 137 when KILL had to.
    return {**base, "ran": True, "exit_code": code, "timed_out": code in (124, 137), "log_tail": tail[-LOG_TAIL_CHARS:],
            "error": None}


def judge_note(rep: dict[str, Any]) -> str:
    """How reproduce.sh ran, as the judge of an execution or results leaf reads it."""
    if not rep.get("ran"):
        return f"reproduce.sh was not run: {rep.get('error')}."
    if rep.get("exit_code") is None:
        status = f"its exit status is unknown ({rep.get('error')})"
    elif rep.get("timed_out"):
        status = f"it was stopped at its time limit of {rep['timeout_s']:.0f} s"
    else:
        status = f"it exited with status {rep['exit_code']} after {rep['seconds']:.1f} s"
    return (f"reproduce.sh was run from the submission's root in a fresh sandbox without network: {status}. "
            f"Files it wrote are among the submission's files; its output is {LOG}. The end of its output:\n"
            f"{rep.get('log_tail') or '(no output)'}")
