"""Running a sweep's jobs on Ray Jobs: submit under a concurrency cap, poll, and collect
each job's end (status, driver exit code, Ray's message, the tail of its log).

A job that fails is recorded and the others go on; a job that cannot even be submitted
is recorded as failed with the submission's error. An interrupt (Ctrl-C) stops every job
still running before it propagates, so nothing keeps running unwatched.

:class:`JobRunner` talks to anything with the ``JobSubmissionClient`` methods it calls
(``submit_job``, ``get_job_info``, ``get_job_logs``, ``stop_job``), so its cap and
bookkeeping are testable without Ray.
"""

from __future__ import annotations

import logging
import re
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

log = logging.getLogger(__name__)

SUCCEEDED, FAILED, STOPPED = "SUCCEEDED", "FAILED", "STOPPED"
# Not Ray's: a job Ray calls SUCCEEDED whose run directory cannot be read where the
# summary runs (its driver wrote it on another node's disk, or it is incomplete).
RUN_MISSING = "RUN_MISSING"
_TERMINAL = {SUCCEEDED, FAILED, STOPPED}
# What a failed driver's log ends with: the exception, or the entry point's one-line error.
_EXCEPTION_LINE = re.compile(r"^(error: |[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b)")
# A head that has just started answers before its job agent has registered; Ray says to
# try again later, and so we do (busy_retry_s).
_BUSY = "please try again later"
_BOILERPLATE = ("run directory:", "Set the environment variable HYDRA_FULL_ERROR")


@dataclass(frozen=True)
class JobSpec:
    num: int
    overrides: tuple[str, ...]  # the point's overrides (what the summary shows)
    entrypoint: str
    run_dir: str


@dataclass
class JobOutcome:
    num: int
    overrides: tuple[str, ...]
    run_dir: str
    submission_id: str | None = None
    status: str = "PENDING"  # Ray's job status; FAILED also when it could not be submitted
    exit_code: int | None = None  # the driver's (python -m milo_ray.run) exit code
    message: str | None = None  # Ray's message for the job's end, or the submission error
    log_tail: str = ""
    log_path: str | None = None
    submitted_at: float | None = None
    started_at: float | None = None  # the driver's start and end as Ray reports them (epoch s)
    finished_at: float | None = None
    driver_node_id: str | None = None  # the node the driver ran on (Ray's job info)
    driver_node: str | None = None  # that node described: id, address, head or worker, alive
    run_problem: str | None = None  # why the job's run cannot be read (set by the summary)

    @property
    def ok(self) -> bool:
        return self.status == SUCCEEDED

    def error(self) -> str | None:
        """One line saying why the job failed: the last exception or ``error:`` line of its
        log, else its last line that is not boilerplate, else Ray's message; None for a job
        that succeeded."""
        if self.ok:
            return None
        if self.status == RUN_MISSING and self.run_problem:
            return self.run_problem
        for text in (self.log_tail, self.message or ""):  # Ray's message may quote the log's end too
            lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
            raised = next((ln for ln in reversed(lines) if _EXCEPTION_LINE.match(ln)), None)
            last = next((ln for ln in reversed(lines) if not ln.startswith(_BOILERPLATE)), None)
            if raised or last:
                return raised or last
        return self.status


@dataclass
class JobRunner:
    client: Any
    max_concurrent: int
    entrypoint_num_cpus: float | None = None
    entrypoint_resources: dict[str, float] | None = None
    entrypoint_label_selector: dict[str, str] | None = None  # pins the drivers to a node (.placement)
    runtime_env: dict[str, Any] | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    poll_s: float = 2.0
    log_tail_lines: int = 20
    log_dir: Path | None = None
    busy_retry_s: float = 120.0  # how long a job server without a ready job agent is asked again
    say: Callable[[str], None] = print
    sleep: Callable[[float], None] = time.sleep

    def run(self, specs: Sequence[JobSpec]) -> list[JobOutcome]:
        """Run every job; returns their outcomes in the order of ``specs``."""
        waiting = deque(specs)
        outcomes = {s.num: JobOutcome(num=s.num, overrides=s.overrides, run_dir=s.run_dir) for s in specs}
        running: dict[int, str] = {}  # job number -> submission id
        try:
            while waiting or running:
                while waiting and len(running) < self.max_concurrent:
                    spec = waiting.popleft()
                    sid = self._submit(spec, outcomes[spec.num])
                    if sid is not None:
                        running[spec.num] = sid
                if running:
                    self.sleep(self.poll_s)
                for num, sid in list(running.items()):
                    if self._poll(sid, outcomes[num]):
                        del running[num]
        except BaseException:
            for num, sid in running.items():
                self._stop(sid, outcomes[num])
            raise
        return [outcomes[s.num] for s in specs]

    def _submit(self, spec: JobSpec, out: JobOutcome) -> str | None:
        out.submitted_at = time.time()
        deadline = time.monotonic() + self.busy_retry_s
        while True:
            try:
                sid = self.client.submit_job(
                    entrypoint=spec.entrypoint, runtime_env=self.runtime_env,
                    metadata={**self.metadata, "sweep_job": str(spec.num)},
                    entrypoint_num_cpus=self.entrypoint_num_cpus, entrypoint_resources=self.entrypoint_resources,
                    entrypoint_label_selector=self.entrypoint_label_selector)
                break
            except Exception as exc:
                if _BUSY in str(exc) and time.monotonic() < deadline:
                    self.sleep(max(self.poll_s, 1.0))
                    continue
                # The job server refused it: this job fails, the others go on.
                out.status, out.message = FAILED, f"not submitted: {type(exc).__name__}: {exc}"
                self.say(f"sweep: job {spec.num} {out.message}")
                return None
        out.submission_id = sid
        self.say(f"sweep: job {spec.num} submitted as {sid}: {' '.join(spec.overrides)}")
        return sid

    def _poll(self, sid: str, out: JobOutcome) -> bool:
        """Record the job's state; True once it has ended."""
        info = self.client.get_job_info(sid)
        status = str(getattr(info.status, "value", info.status))
        out.status = status
        if status not in _TERMINAL:
            return False
        self._finish(sid, info, out)
        what = f"{status} in {out.finished_at - out.started_at:.0f} s" if out.started_at and out.finished_at else status
        detail = "" if out.ok else f": {out.error()}"
        self.say(f"sweep: job {out.num} {what}{detail}")
        return True

    def _finish(self, sid: str, info: Any, out: JobOutcome) -> None:
        out.exit_code = getattr(info, "driver_exit_code", None)
        out.message = getattr(info, "message", None)
        out.driver_node_id = getattr(info, "driver_node_id", None) or None
        start, end = getattr(info, "start_time", None), getattr(info, "end_time", None)
        out.started_at = start / 1000.0 if start else None  # Ray reports milliseconds
        out.finished_at = end / 1000.0 if end else None
        try:
            text = self.client.get_job_logs(sid) or ""
        except Exception as exc:  # logs are a convenience; the status stands without them
            text = f"(no log: {type(exc).__name__}: {exc})"
        out.log_tail = "\n".join(text.rstrip().splitlines()[-self.log_tail_lines:])
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            path = self.log_dir / f"{out.num}.log"
            path.write_text(text)
            out.log_path = str(path)

    def _stop(self, sid: str, out: JobOutcome) -> None:
        try:
            self.client.stop_job(sid)
            out.status, out.message = STOPPED, "stopped: the sweep was interrupted"
        except Exception as exc:
            log.warning("could not stop job %s (%s): %s", out.num, sid, exc)
