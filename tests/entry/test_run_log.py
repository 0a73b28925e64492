"""run.log holds every session of a run: an opening line (new run or resumed, the
overrides) and a closing line (status, seconds, the summary's headline figures)."""

from __future__ import annotations

import re


def test_a_finished_runs_log_opens_and_closes_its_session(shared_runs):
    text = (shared_runs / "milo" / "run.log").read_text()
    opened = re.findall(r"session (\d+) of run \S+ started \((new run|resumed)\) on \S+; milo_ray git \S+; "
                        r"overrides: (.*)", text)
    assert [(n, how) for n, how, _ in opened] == [("1", "new run")]
    assert "method.max_rounds=2" in opened[0][2]
    closed = re.findall(r"session (\d+) ended: status (\w+) after \d+ s(.*)", text)
    assert [(n, status) for n, status, _ in closed] == [("1", "finished")]
    assert "stop_reason=" in closed[0][2] and "executions_used=" in closed[0][2]
