"""JobRunner's cap and bookkeeping, and the launcher's settings, without Ray."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from milo_ray.config.errors import UserError
from milo_ray.sweep.jobs import JobRunner, JobSpec
from milo_ray.sweep.settings import default_max_concurrent, settings_from


@dataclass
class _Info:
    status: str
    driver_exit_code: int | None = None
    message: str | None = None
    start_time: int | None = None
    end_time: int | None = None


class FakeJobs:
    """A job server: each job runs for ``polls`` status polls, then ends as its entrypoint says."""

    def __init__(self, polls: int = 2) -> None:
        self.polls, self.jobs, self.running, self.peak, self.stopped = polls, {}, set(), 0, []

    def submit_job(self, *, entrypoint, **_):
        sid = f"job-{len(self.jobs)}"
        self.jobs[sid] = {"entrypoint": entrypoint, "left": self.polls}
        self.running.add(sid)
        self.peak = max(self.peak, len(self.running))
        return sid

    def get_job_info(self, sid):
        job = self.jobs[sid]
        if sid in self.running:
            job["left"] -= 1
            if job["left"] > 0:
                return _Info("RUNNING")
            self.running.discard(sid)
        failed = "crash" in job["entrypoint"]
        return _Info("FAILED" if failed else "SUCCEEDED", 1 if failed else 0, "job ended", 1_000, 3_000)

    def get_job_logs(self, sid):
        return "starting\nTraceback ...\nRuntimeError: boom\nrun directory: /x  (status: failed)\n" \
            if "crash" in self.jobs[sid]["entrypoint"] else "ok\n"

    def stop_job(self, sid):
        self.stopped.append(sid)
        self.running.discard(sid)


def _specs(*entrypoints):
    return [JobSpec(num=i, overrides=(f"x={i}",), entrypoint=e, run_dir=f"/sweep/{i}")
            for i, e in enumerate(entrypoints)]


def _runner(client, cap, **kw):
    return JobRunner(client, max_concurrent=cap, poll_s=0, say=lambda _: None, sleep=lambda _: None, **kw)


def test_running_jobs_never_exceed_the_cap():
    client = FakeJobs(polls=3)
    outcomes = _runner(client, 2).run(_specs(*["run"] * 5))
    assert client.peak == 2
    assert [o.status for o in outcomes] == ["SUCCEEDED"] * 5


def test_a_failed_job_is_recorded_with_its_log_while_the_others_finish(tmp_path):
    outcomes = _runner(FakeJobs(), 1, log_dir=tmp_path).run(_specs("run", "crash", "run"))
    assert [o.status for o in outcomes] == ["SUCCEEDED", "FAILED", "SUCCEEDED"]
    crashed = outcomes[1]
    assert crashed.exit_code == 1 and crashed.error() == "RuntimeError: boom"  # not the run-directory line
    assert (crashed.started_at, crashed.finished_at) == (1.0, 3.0)  # Ray's milliseconds as seconds
    assert "RuntimeError: boom" in (tmp_path / "1.log").read_text()


def test_a_job_the_server_refuses_fails_alone():
    class Refusing(FakeJobs):
        def submit_job(self, *, entrypoint, **kw):
            if "refused" in entrypoint:
                raise RuntimeError("no such resource")
            return super().submit_job(entrypoint=entrypoint, **kw)

    outcomes = _runner(Refusing(), 2).run(_specs("refused", "run"))
    assert outcomes[0].status == "FAILED" and "no such resource" in outcomes[0].error()
    assert outcomes[1].status == "SUCCEEDED"


def test_an_interrupt_stops_the_running_jobs():
    client = FakeJobs(polls=100)
    calls = []

    def sleep(_):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt

    runner = JobRunner(client, max_concurrent=2, poll_s=0, say=lambda _: None, sleep=sleep)
    with pytest.raises(KeyboardInterrupt):
        runner.run(_specs("run", "run", "run"))
    assert sorted(client.stopped) == ["job-0", "job-1"]  # the third was never submitted


def test_default_cap_is_one_job_per_cpu():
    assert default_max_concurrent(8.0, 0.25) == 8
    assert default_max_concurrent(8.0, 2) == 4  # a driver that reserves 2 CPUs
    assert default_max_concurrent(0.0, 1) == 1  # never zero


def _settings(**over):
    base = {"address": None, "max_concurrent": None, "entrypoint_num_cpus": 0.25, "entrypoint_resources": None,
            "runtime_env": None, "python": None, "poll_s": 2.0, "log_tail_lines": 20}
    return settings_from({**base, **over})


@pytest.mark.parametrize("env_vars", [{"OPENAI_API_KEY": "x"}, {"SOME_VAR": "sk-abc123"}])
def test_a_runtime_env_that_carries_a_key_is_refused(env_vars):
    with pytest.raises(UserError, match="keys never travel in a job's runtime_env"):
        _settings(runtime_env={"env_vars": env_vars})


def test_a_runtime_env_without_keys_passes():
    assert _settings(runtime_env={"env_vars": {"PYTHONPATH": "/code"}}).runtime_env == {
        "env_vars": {"PYTHONPATH": "/code"}}


@pytest.mark.parametrize("over, field", [({"max_concurrent": 0}, "max_concurrent"),
                                         ({"address": "ray://head:10001"}, "address"),
                                         ({"entrypoint_num_cpus": -1}, "entrypoint_num_cpus")])
def test_bad_launcher_settings_name_their_field(over, field):
    with pytest.raises(UserError, match=f"hydra.launcher.{field}"):
        _settings(**over)


def test_a_job_server_not_ready_yet_is_asked_again():
    class NotReadyOnce(FakeJobs):
        refusals = 2

        def submit_job(self, **kw):
            if self.refusals:
                self.refusals -= 1
                raise RuntimeError("No available agent to submit job, please try again later..")
            return super().submit_job(**kw)

    client = NotReadyOnce()
    outcomes = _runner(client, 1).run(_specs("run"))
    assert outcomes[0].status == "SUCCEEDED" and client.refusals == 0


def test_outcomes_fit_one_command_line_argument():
    from milo_ray.sweep.jobs import JobOutcome
    from milo_ray.sweep.summary import pack_outcomes, unpack_outcomes

    import random

    rng = random.Random(0)
    noise = lambda: "".join(rng.choice("abcdefghij0123456789") for _ in range(200))  # noqa: E731
    many = [JobOutcome(num=i, overrides=(f"x={i}",), run_dir=f"/s/{i}", status="FAILED", message=noise(),
                       log_tail="\n".join(noise() for _ in range(20)) + "\nRuntimeError: boom") for i in range(300)]
    packed = pack_outcomes(many)
    assert len(packed) <= 100_000
    back = unpack_outcomes(packed)
    assert [o.num for o in back] == list(range(300)) and back[7].error() == "RuntimeError: boom"
    few = many[:2]
    assert unpack_outcomes(pack_outcomes(few)) == few  # whole when it fits


def test_a_sweep_whose_jobs_wrote_no_run_still_gets_its_summary(tmp_path):
    import pandas as pd

    from milo_ray.sweep.jobs import JobOutcome
    from milo_ray.sweep.summary import write_summary

    died = JobOutcome(num=0, overrides=("method=eval",), run_dir=str(tmp_path / "0"), status="FAILED", exit_code=1,
                      log_tail="ModuleNotFoundError: No module named 'milo_ray'")
    paths = write_summary(tmp_path, [died])
    row = pd.read_parquet(paths["parquet"]).iloc[0]
    assert row["status"] == "FAILED" and row["error"] == "ModuleNotFoundError: No module named 'milo_ray'"
    assert pd.isna(row["run_status"]) and pd.isna(row["pr_at_k"])
    md = paths["markdown"].read_text()
    assert "No module named 'milo_ray'" in md and "No comparison page: no job's run can be read" in md
    assert "comparison" not in paths


def test_every_job_is_submitted_with_the_drivers_node_selector():
    class Recording(FakeJobs):
        def submit_job(self, *, entrypoint, **kw):
            self.seen = [*getattr(self, "seen", []), kw.get("entrypoint_label_selector")]
            return super().submit_job(entrypoint=entrypoint, **kw)

    client = Recording()
    selector = {"ray.io/node-id": "head-id"}
    _runner(client, 2, entrypoint_label_selector=selector).run(_specs("run", "run", "run"))
    assert client.seen == [selector] * 3
