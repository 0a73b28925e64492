"""The ``ray_jobs`` launcher's sequence: check every point, find the Ray to submit to,
run one job per point under the cap, write the summary, stop what it started.

Each job is its own driver, ``python -m milo_ray.run <the point's overrides>
run.dir=<sweep dir>/<n>``: it connects to Ray per its own ``execution`` config (inside a
Ray job that means the job's cluster, ``RAY_ADDRESS``), so ``execution.slots_per_node``,
``group_limit``, ``max_retries`` and ``address`` are each job's own. The settings that
find or size the shared local Ray (``execution.num_cpus``, ``join_running``,
``dashboard``) must agree across points (:mod:`.points`).

On a Ray on this machine the jobs run in the launcher's working directory with its
interpreter and ``PYTHONPATH``, so they run the code and read the paths the launcher
checked; on a cluster they run in the job's working directory there (a ``runtime_env``
``working_dir`` if given) and the summary is written by a last job on the cluster, where
the run directories are. Every driver, and that last job, is pinned to the node whose disk
holds the run directories (:mod:`.placement`), and the summary checks each job's run
(:mod:`.summary`): a job whose run cannot be read counts as failed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from milo_ray.config.errors import set_jobs_launched
from milo_ray.sweep import placement
from milo_ray.sweep.jobs import RUN_MISSING, SUCCEEDED, JobOutcome, JobRunner, JobSpec
from milo_ray.sweep.local_ray import local_ray, use_configured_token
from milo_ray.sweep.points import SweepPoint, compose_points, expand, job_overrides
from milo_ray.sweep.settings import LauncherSettings, default_max_concurrent

LOGS_DIR = "logs"


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


_NODES_WAIT_S = 60.0  # a head that just started lists no node for a few seconds


def cluster_cpus(dashboard_url: str, *, wait_s: float = _NODES_WAIT_S) -> float:
    """CPUs of the cluster's alive nodes, as Ray's state API reports them (waiting up to
    ``wait_s`` for a just-started head to list itself)."""
    from ray.util.state import list_nodes

    deadline = time.monotonic() + wait_s
    while True:
        nodes = list_nodes(address=dashboard_url, detail=True)
        cpus = float(sum((n.resources_total or {}).get("CPU", 0.0) for n in nodes if n.state == "ALIVE"))
        if cpus > 0 or time.monotonic() > deadline:
            return cpus
        time.sleep(1.0)


def sweep_budget_overrides(max_usd: float | None, sweep_dir: Path) -> list[str]:
    """The run settings that make a job charge the sweep's shared ledger (``hydra.launcher.
    max_usd``): its name, from the sweep directory (so a sweep launched again into it keeps
    counting on the same ledger), and the cap. None: no overrides."""
    if max_usd is None:
        return []
    ledger = "sweep-" + hashlib.sha256(str(sweep_dir).encode()).hexdigest()[:16]
    return [f"run.budget.sweep.ledger={ledger}", f"run.budget.sweep.cost_usd={float(max_usd)!r}"]


def entrypoint(python: str, overrides: Sequence[str], cwd: str | None) -> str:
    command = shlex.join([python, "-m", "milo_ray.run", *overrides])
    return f"cd {shlex.quote(cwd)} && {command}" if cwd else command


@dataclass
class SweepResult:
    outcomes: list[JobOutcome]
    summary: dict[str, Any] = field(default_factory=dict)  # summary file -> path (as strings on a cluster)

    @property
    def failed(self) -> list[JobOutcome]:
        return [o for o in self.outcomes if not o.ok]


class SweepLauncher:
    """Plain object behind the Hydra plugin: ``setup`` checks every point (``UserError``
    on the first bad one), ``launch`` runs them."""

    def __init__(self, settings: LauncherSettings) -> None:
        self.settings = settings
        self.config: Any = None
        self.config_loader: Any = None
        self.points: dict[tuple[str, ...], SweepPoint] = {}

    def setup(self, config: Any, config_loader: Any) -> None:
        self.config, self.config_loader = config, config_loader
        points = compose_points(config, config_loader, expand(config, config_loader))
        self.points = {p.overrides: p for p in points}

    def _points(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list[SweepPoint]:
        if all(tuple(o) in self.points for o in job_overrides):
            return [SweepPoint(num=initial_job_idx + i, overrides=tuple(o), config=self.points[tuple(o)].config)
                    for i, o in enumerate(job_overrides)]
        return compose_points(self.config, self.config_loader, job_overrides, initial_job_idx)

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> tuple[list[SweepPoint],
                                                                                            SweepResult]:
        points = self._points(job_overrides, initial_job_idx)
        local = self.settings.address is None
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        if local:
            sweep_dir = sweep_dir.resolve()
        head = None
        try:
            if local:
                execution = points[0].config.execution
                head = local_ray(join_running=bool(execution.join_running), num_cpus=execution.num_cpus,
                                 log_path=sweep_dir / LOGS_DIR / "ray_head.log")
                url = head.dashboard_url
                _say(f"sweep: started a Ray head for the sweep, dashboard {url} (stopped when the sweep ends)"
                     if head.started_here else f"sweep: joined the Ray running on this machine, dashboard {url}")
            else:
                use_configured_token()
                url = str(self.settings.address)
            result = self._run(points, url, sweep_dir, local)
        finally:
            if head is not None:
                head.stop()
        return points, result

    def _run(self, points: list[SweepPoint], url: str, sweep_dir: Path, local: bool) -> SweepResult:
        from ray.job_submission import JobSubmissionClient

        s = self.settings
        client = JobSubmissionClient(url)
        cap = s.max_concurrent or default_max_concurrent(cluster_cpus(url), s.entrypoint_num_cpus)
        python = s.python or (sys.executable if local else "python")
        runtime_env = dict(s.runtime_env or {})
        if local and os.environ.get("PYTHONPATH"):
            # The jobs import the code the launcher checked (a worktree, test fakes), not
            # whatever the Ray's own environment would find.
            env_vars = dict(runtime_env.get("env_vars") or {})
            env_vars.setdefault("PYTHONPATH", os.environ["PYTHONPATH"])
            runtime_env["env_vars"] = env_vars
        specs = []
        for p in points:
            run_dir = str(sweep_dir / str(p.num))
            command = entrypoint(python, [*job_overrides(p, run_dir), *sweep_budget_overrides(s.max_usd, sweep_dir)],
                                 os.getcwd() if local else None)
            specs.append(JobSpec(num=p.num, overrides=p.overrides, run_dir=run_dir, entrypoint=command))
        selector, node = placement.driver_selector(
            placement.cluster_nodes(url) if s.driver_node == "auto" else [], driver_node=s.driver_node,
            run_dir=str(self.config.hydra.sweep.dir), local=local, entrypoint_resources=s.entrypoint_resources)
        rule = "hydra.launcher.max_concurrent" if s.max_concurrent else "one per CPU of the cluster"
        where = f"drivers on {node.describe()}, which holds the run directories" if node is not None else \
            "drivers wherever Ray finds their resources (hydra.launcher.driver_node=any or a URI run.dir)"
        _say(f"sweep: {len(specs)} job(s) on Ray Jobs at {url} (watch them on its dashboard), at most {cap} at once "
             f"({rule}); {where}; sweep dir {sweep_dir}")
        runner = JobRunner(client, max_concurrent=cap, entrypoint_num_cpus=s.entrypoint_num_cpus,
                           entrypoint_resources=s.entrypoint_resources, entrypoint_label_selector=selector,
                           runtime_env=runtime_env or None,
                           metadata={"sweep_dir": str(sweep_dir)}, poll_s=s.poll_s, log_tail_lines=s.log_tail_lines,
                           log_dir=sweep_dir / LOGS_DIR if local else None, say=_say)
        set_jobs_launched()
        outcomes = runner.run(specs)
        nodes = placement.nodes_or_empty(url)
        for o in outcomes:
            o.driver_node = placement.describe_node(o.driver_node_id, nodes)
        if local:
            from milo_ray.sweep.summary import write_summary

            summary: dict[str, Any] = {k: str(v) for k, v in write_summary(sweep_dir, outcomes).items()}
        else:
            summary = self._summary_on_cluster(client, sweep_dir, outcomes, python, runtime_env or None, selector)
        for o in outcomes:
            if o.status == RUN_MISSING:
                _say(f"sweep: job {o.num} {RUN_MISSING}: Ray says it succeeded, but {o.run_problem}")
        return SweepResult(outcomes=outcomes, summary=summary)

    def _summary_on_cluster(self, client: Any, sweep_dir: Path, outcomes: list[JobOutcome], python: str,
                            runtime_env: dict | None, selector: dict[str, str] | None) -> dict[str, Any]:
        """Write the summary where the run directories are: as one more job on the cluster,
        on the drivers' node; the jobs whose run it cannot read are marked on ``outcomes``."""
        from milo_ray.sweep.summary import RUN_PROBLEM_LINE, pack_outcomes

        command = shlex.join([python, "-m", "milo_ray.sweep.summary", str(sweep_dir), pack_outcomes(outcomes)])
        sid = client.submit_job(entrypoint=command, runtime_env=runtime_env, entrypoint_label_selector=selector,
                                metadata={"sweep_dir": str(sweep_dir), "sweep_job": "summary"})
        while str(getattr(client.get_job_status(sid), "value", "")) not in ("SUCCEEDED", "FAILED", "STOPPED"):
            time.sleep(self.settings.poll_s)
        status = str(client.get_job_status(sid).value)
        text = client.get_job_logs(sid) or ""
        if status != SUCCEEDED:
            _say(f"sweep: the summary job {sid} {status}:\n{text[-2000:]}")
            return {}
        by_num = {o.num: o for o in outcomes}
        for line in text.splitlines():  # summary.main's line per job whose run it cannot read
            if line.startswith(RUN_PROBLEM_LINE):
                seen = json.loads(line[len(RUN_PROBLEM_LINE):])
                by_num[seen["job"]].status, by_num[seen["job"]].run_problem = seen["status"], seen["run_problem"]
        # summary.main prints one "<name>: <path>" line per file it wrote.
        names = ("parquet", "markdown", "comparison")
        return dict(line.split(": ", 1) for line in text.splitlines()
                    if line.startswith(tuple(f"{n}: " for n in names)))
