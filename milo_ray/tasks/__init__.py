"""Checking a task suite before a run spends anything on it (``python -m milo_ray.tasks check PATH``).

For every task of a Harbor directory or a SWE-style JSONL file: static checks (format,
files, which sandbox can run it, whether its image is on the Docker host, whether its
verifier script has a fetch step, a note), its reference solution graded, a do-nothing agent
graded, optionally the reference solution again to catch a flaky verifier -- all through
the rollout scheduler, in parallel -- and one verdict per task (:mod:`.verdicts`).

Modules: :mod:`.static` (what can be known without running a task), :mod:`.preflight`
(the same image and sandbox checks for every run, before it writes anything),
:mod:`.executor` (the oracle and the do-nothing agent as one executor), :mod:`.verdicts`
(the pure decision), :mod:`.check` (composing the config and running the check),
:mod:`.output` (the table, Parquet, markdown and split file).

Not to be confused with :mod:`milo_ray.core.tasks`, the task value type.
"""
