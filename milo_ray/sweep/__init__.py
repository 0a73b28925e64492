"""Hydra sweeps as Ray Jobs (``-m hydra/launcher=ray_jobs``).

One Ray job per sweep point, each its own driver (``python -m milo_ray.run <the point's
overrides> run.dir=<sweep dir>/<n>``), after every point has passed the checks a run makes
before it writes anything. The package owns the parts; the Hydra plugin
(``hydra_plugins/milo_ray_jobs_launcher``) is a thin shell over :mod:`.launcher`:

* :mod:`.settings`: the launcher's config (``hydra.launcher.*``) and its checks;
* :mod:`.points`: expanding and checking the sweep's points;
* :mod:`.local_ray`: the local Ray with a dashboard the jobs run on when no address is given;
* :mod:`.jobs`: submitting under a concurrency cap, polling, collecting each job's end and log;
* :mod:`.summary`: ``summary.parquet`` / ``summary.md`` and the comparison page;
* :mod:`.launcher`: the sequence, from points to summary and exit code.

Nothing here imports Ray or the run's heavy modules at import time: Hydra imports the
plugin on every start, sweeps or not.
"""
