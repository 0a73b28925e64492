"""The ARE host process (milo_ray/benchmarks/are/episode.py) starts with an environment
that holds no provider key or cloud credential of the process that starts it."""

from __future__ import annotations

from milo_ray.benchmarks.are.episode import _host_env


def test_are_host_process_gets_no_credential(monkeypatch):
    for name in ("OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "HF_TOKEN",
                 "GOOGLE_APPLICATION_CREDENTIALS", "MILO_RAY_GRADER_KEY"):
        monkeypatch.setenv(name, "secret-value")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    env = _host_env()
    assert "secret-value" not in env.values()
    assert env["PATH"] == "/usr/bin:/bin"
