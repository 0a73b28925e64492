"""Runs a list of command lines through the entry point (``milo_ray.run.main``) in one
process, so they share one Ray instance; writes each job's exit code as JSON.

Usage: python cli_jobs.py JOBS_JSON OUT_JSON   (JOBS_JSON: {"name": [arg, ...], ...})

``main(argv)`` is exactly what ``python -m milo_ray.run ARGV`` runs after the
interpreter starts; sharing the process only saves a Ray start per job.
"""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    jobs_path, out_path = sys.argv[1], sys.argv[2]  # main() below rewrites sys.argv
    jobs = json.loads(open(jobs_path).read())
    out: dict[str, dict] = {}
    from milo_ray.run import main as run_main

    for name, argv in jobs.items():
        t0 = time.monotonic()
        try:
            code = run_main(list(argv))
        except BaseException as exc:  # a job must not take the others down
            code = f"raised {type(exc).__name__}: {exc}"
        out[name] = {"code": code, "seconds": round(time.monotonic() - t0, 1)}
        print(f"[cli_jobs] {name}: {code} in {out[name]['seconds']} s", file=sys.stderr, flush=True)
        with open(out_path, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
