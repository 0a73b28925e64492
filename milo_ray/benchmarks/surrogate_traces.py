"""Synthetic traces for the surrogate SIMULATOR: an agent-trajectory JSON and a ctrf report.

The trajectory is shaped like a real deepagents trace (steps with role, content, tool
calls with args, observations, timestamps). Its *ending* shows how the attempt ended:
each failure mode has a recognizable textual pattern (the kind of evidence an LLM
mutator or judge reads in a real trace); with probability ``label_noise`` the shown
ending is a different mode or an ambiguous one. The true mode is never written into
the trace.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from milo_ray.harness.mechanisms import FAILURE_MODES

SCHEMA = "milo_ray.trajectory/v1"


def _ending_steps(shown: str, task_id: str, n_tests: int, cap: float, rng: np.random.Generator) -> list[dict[str, Any]]:
    mod = task_id.replace("-", "_")
    if shown == "success":
        return [
            {"role": "assistant", "content": "Running the full test suite before finishing.",
             "tool_calls": [{"name": "execute", "args": {"command": f"cd /app && python -m pytest tests/ -q"}}]},
            {"role": "tool", "content": f"{n_tests} passed in {rng.uniform(2, 40):.1f}s"},
            {"role": "assistant", "content": f"All {n_tests} tests pass on the final state; the task is done."},
        ]
    if shown == "premature_completion":
        return [
            {"role": "assistant", "content": "The change is written.",
             "tool_calls": [{"name": "write_file", "args": {"file_path": f"/app/{mod}/core.py", "content": "..."}}]},
            {"role": "tool", "content": f"wrote /app/{mod}/core.py"},
            {"role": "assistant", "content": "I have implemented the required change, so the task should be "
                                             "complete now. Finishing without further checks."},
        ]
    if shown == "deadline_overrun":
        return [
            {"role": "assistant", "content": "Let me explore one more approach before finalizing.",
             "tool_calls": [{"name": "execute", "args": {"command": f"cd /app && ./build_all.sh --{mod}"}}]},
            {"role": "tool", "content": f"[runner] agent time limit of {cap:.0f}s reached; the attempt was stopped "
                                        "and graded in its current state (no deliverable saved)."},
        ]
    if shown == "lax_verification":
        return [
            {"role": "assistant", "content": "Quick sanity check.",
             "tool_calls": [{"name": "execute", "args": {"command": f"python -c 'import {mod}; print(\"ok\")'"}}]},
            {"role": "tool", "content": "ok"},
            {"role": "assistant", "content": "My smoke check prints ok, which confirms the fix works. Done."},
        ]
    if shown == "missing_knowhow":
        tool = ["pip install --frozen", "make configure-legacy", "service start --foreground"][int(rng.integers(3))]
        return [
            {"role": "assistant", "content": "Trying to set up the toolchain.",
             "tool_calls": [{"name": "execute", "args": {"command": tool}}]},
            {"role": "tool", "content": f"error: unknown option in '{tool}'; see --help"},
            {"role": "assistant", "content": "Trying another way.",
             "tool_calls": [{"name": "execute", "args": {"command": tool.split()[0] + " --help"}}]},
            {"role": "tool", "content": "usage: ... (no matching subcommand)"},
            {"role": "assistant", "content": "I do not know how to configure this toolchain correctly; "
                                             "leaving the closest approximation in place."},
        ]
    if shown == "context_overflow":
        return [
            {"role": "assistant", "content": "Dumping the logs to see what is going on.",
             "tool_calls": [{"name": "execute", "args": {"command": f"cat /var/log/{mod}/*.log"}}]},
            {"role": "tool", "content": f"[... {int(rng.integers(120_000, 900_000))} characters of output ...]"},
            {"role": "system", "content": "context window exceeded: earlier messages were summarized and dropped."},
            {"role": "assistant", "content": "I lost track of which files I already changed; re-reading the task "
                                             "and starting the edit over."},
        ]
    if shown == "tool_misuse":
        return [
            {"role": "assistant", "content": "Editing the function.",
             "tool_calls": [{"name": "edit_file", "args": {"file_path": f"/app/{mod}/core.py", "old_string": "def run(",
                                                           "new_string": "def run(self, "}}]},
            {"role": "tool", "content": "Error: old_string not found in file (invalid arguments)"},
            {"role": "assistant", "content": "Retrying the same edit.",
             "tool_calls": [{"name": "edit_file", "args": {"file_path": f"/app/{mod}/core.py", "old_string": "def run(",
                                                           "new_string": "def run(self, "}}]},
            {"role": "tool", "content": "Error: old_string not found in file (invalid arguments)"},
            {"role": "assistant", "content": "Overwriting the whole file instead.",
             "tool_calls": [{"name": "write_file", "args": {"file_path": f"/app/{mod}/core.py", "content": ""}}]},
            {"role": "tool", "content": "wrote 0 bytes"},
        ]
    return [  # ambiguous: nothing distinctive
        {"role": "assistant", "content": "Stopping here with the current state."},
    ]


def shown_ending(true_ending: str, label_noise: float, rng: np.random.Generator) -> str:
    """What the trace shows: the true ending, or with prob label_noise another/ambiguous one."""
    if true_ending == "success" or rng.random() >= label_noise:
        return true_ending
    others = [m for m in FAILURE_MODES if m != true_ending] + ["ambiguous"]
    return others[int(rng.integers(len(others)))]


def trajectory(task, harness_id: str, rollout_idx: int, model_id: str, shown: str, seconds: float,
               output_tokens: int, timed_out: bool, rng: np.random.Generator) -> dict[str, Any]:
    mod = task.task_id.replace("-", "_")
    steps: list[dict[str, Any]] = [
        {"role": "user", "content": task.instruction},
        {"role": "assistant", "content": "Inspecting the project layout first.",
         "tool_calls": [{"name": "execute", "args": {"command": f"ls -R /app/{mod} | head -50"}}]},
        {"role": "tool", "content": f"/app/{mod}:\ncore.py  cli.py  tests/  README.md"},
        {"role": "assistant", "content": "Reading the module that the task is about.",
         "tool_calls": [{"name": "read_file", "args": {"file_path": f"/app/{mod}/core.py"}}]},
        {"role": "tool", "content": "def run(config):\n    ...\n"},
    ]
    steps += _ending_steps(shown, task.task_id, int(task.metadata.get("n_tests", 1)), task.time_cap_s, rng)
    ts = np.sort(rng.uniform(0.0, seconds, size=len(steps)))
    for i, (s, t) in enumerate(zip(steps, ts)):
        s["step"] = i
        s["timestamp"] = round(float(t), 2)
    return {
        "schema": SCHEMA, "simulated": True, "task_id": task.task_id, "harness_id": harness_id,
        "rollout_idx": rollout_idx, "model_id": model_id, "steps": steps,
        "final": {"status": "timeout" if timed_out else "completed", "agent_seconds": round(seconds, 2),
                  "output_tokens": output_tokens},
    }


_FAIL_MESSAGES = {
    "success": "AssertionError: output differs from expected",
    "premature_completion": "AssertionError: required behaviour missing (step not implemented)",
    "deadline_overrun": "not reached: agent timed out before a deliverable existed",
    "lax_verification": "AssertionError: edge case returns wrong value",
    "missing_knowhow": "RuntimeError: service/toolchain not configured",
    "context_overflow": "AssertionError: partial edit left inconsistent state",
    "tool_misuse": "SyntaxError: file truncated or malformed",
    "ambiguous": "AssertionError: unexpected result",
}


def ctrf(task_id: str, n_tests: int, passed: int, shown: str, seconds: float) -> dict[str, Any]:
    tests = []
    for k in range(n_tests):
        ok = k < passed
        tests.append({"name": f"test_{task_id.replace('-', '_')}_{k:02d}", "status": "passed" if ok else "failed",
                      "duration": 10 + 7 * k, **({} if ok else {"message": _FAIL_MESSAGES.get(shown, "failed")})})
    stop = int(seconds * 1000)
    return {"results": {"tool": {"name": "surrogate-grader"},
                        "summary": {"tests": n_tests, "passed": passed, "failed": n_tests - passed, "skipped": 0,
                                    "pending": 0, "other": 0, "start": 0, "stop": stop},
                        "tests": tests}}
