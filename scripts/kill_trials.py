"""Random-kill resume trials: SIGKILL a run's driver at random moments, resume it with
``run.resume=``, and check the finished run against an uninterrupted run of the same seed.

    python scripts/kill_trials.py --trials 20 [--methods eval,milo_lockstep,...] [--out DIR]
                                  [--max-kills 3] [--seed 0] [--jobs 1]

Each trial runs ``python -m milo_ray.run ARGS run.dir=RUN`` in its own process group
(so the Ray instance and workers the driver started die with it), kills the whole group
with SIGKILL after a random delay, reads what the store then holds, resumes with
``run.resume=RUN``, and repeats up to ``--max-kills`` times (a session that finishes
before its kill ends the trial early). The last session runs to the end.

Checks on the finished run (tables read with ``milo_ray.results.load_run``):

* ``finished``: the manifest says the run finished;
* ``lost_rollout``: every rollout stored before a kill is in the final table with the same score;
* ``duplicate_key``: no cache key appears twice in the final rollouts;
* ``repeated_call``: every agent call stored before a kill is in the final table once and
  unchanged (the same tokens and time: a call made again after the kill would carry new ones),
  and no ``call_id`` appears twice;
* ``budget``: budgeted executions never exceed ``run.budget.executions``;
* ``lineage``: every parent and co-parent names a stored harness, no harness row is
  duplicated, and the rows stored before a kill are kept;
* ``equal_tables`` (deterministic methods only): rollouts, harnesses, agent calls and events
  equal the uninterrupted run's, ignoring times, node ids, latencies and trace references.

Free-running MILO and the instance-level track are not deterministic (islands interleave by
timing; optimizer runs are time-bound), so only the invariants apply to them.

Prints a per-method table (trials, kills, passes, failures with reasons); exit code 1 when
any trial failed. ``--break CHECK`` disables one check's detection (to show a check can fail:
``ignore-duplicates``, ``ignore-lost``, ``ignore-calls``, ``ignore-budget``, ``ignore-lineage``,
``ignore-tables``); it exists only to test this script.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from milo_ray.testing.processes import reap_session  # noqa: E402

QUIET = ["run.progress=false", "run.report=false", "execution.num_cpus=2"]
MILO_SMALL = ["method.search_size=4", "method.val_size=3", "method.k_search=1", "method.k_val=1", "method.k_test=1",
              "method.max_rounds=2", "method.patience=1"]


@dataclass(frozen=True)
class MethodSpec:
    name: str
    args: tuple[str, ...]
    deterministic: bool


METHODS = {
    "eval": MethodSpec("eval", ("method=eval", "method.k=2", "benchmark=surrogate_tb21"), True),
    "milo_lockstep": MethodSpec("milo_lockstep", (*MILO_SMALL, "method.round_sync=true"), True),
    "milo_free": MethodSpec("milo_free", (*MILO_SMALL, "method.round_sync=false"), False),
    "ssr": MethodSpec("ssr", ("method=ssr", "benchmark=surrogate_tb21", "method.scales=[0.5,1.0]", "method.b_v=[2,2]",
                              "method.b_s=1", "method.b_f=1", "method.rollouts=1", "method.patience=1",
                              "method.test_rollouts=2", "run.budget.executions=60"), True),
    "einstein": MethodSpec("einstein", ("+experiment=milo_einstein", "benchmark.problem=first_autocorrelation",
                                        "benchmark.budget_s=1", "benchmark.grace_s=1", "run.time_limit_s=null",
                                        "method.search_size=2", "method.val_size=1", "method.max_rounds=1",
                                        "method.num_islands=2", "method.seeds=[lse_adam,subgradient]"), False),
}

# Columns that legitimately differ between an interrupted and an uninterrupted run.
_VOLATILE = {"started_at", "finished_at", "latency_s", "node", "trace_ref", "time", "seq", "created_at", "run_id",
             "attempts"}
# Events about a session rather than the run: a Ray worker released when idle, an
# infrastructure retry, SSR's note that a resumed session fast-forwards, the embedder each
# session loads.
_SESSION_EVENTS = {"rollout_worker_released", "rollout_retry", "ssr.resume", "embedder.loaded"}
BREAKS = ("ignore-duplicates", "ignore-lost", "ignore-calls", "ignore-budget", "ignore-lineage", "ignore-tables")


def _ray_tmp(name: str) -> str:
    # Short and private to this process: Ray's socket paths under it must stay below the
    # 107-byte limit of a Unix socket name, and no other driver may join a trial's Ray.
    return f"/tmp/kt{os.getpid()}/{name}"


def _env(ray_tmp: str) -> dict[str, str]:
    return {**os.environ, "RAY_TMPDIR": ray_tmp, "HF_HUB_OFFLINE": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def _session(argv: list[str], **kw: Any) -> tuple[bool, float, int | None]:
    """:func:`_one_session`, again (up to three times) when the driver exited without ever
    coming up: on a loaded machine Ray's start-up can time out, which is not the run's
    doing. A fresh run whose store was opened before Ray failed starts from nothing."""
    for attempt in range(3):
        killed, up, code = _one_session(argv, **kw)
        if killed or code == 0 or up is not None:
            return killed, up or 0.0, code
        run_dir = kw["run_dir"]
        if not (run_dir / "manifest.json").exists():
            shutil.rmtree(run_dir, ignore_errors=True)
        with open(kw["log"], "a") as f:
            f.write(f"\n[kill_trials] session never came up (exit {code}); starting it again\n")
    return killed, up or 0.0, code


def _one_session(argv: list[str], *, run_dir: Path, ray_tmp: str, log: Path, kill_after: float | None,
             timeout: float = 900) -> tuple[bool, float, int | None]:
    """One driver session. ``kill_after`` counts from the moment the run is up (its
    manifest written for this session, i.e. Ray started and the store open): a kill
    while Ray starts tests nothing of the run. Returns (killed, seconds the run was up,
    exit code or None when killed)."""
    manifest = run_dir / "manifest.json"
    stamp = manifest.stat().st_mtime_ns if manifest.exists() else None
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "milo_ray.run", *argv], cwd=ROOT, env=_env(ray_tmp),
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        up = None
        try:
            while proc.poll() is None and time.monotonic() < deadline:
                if up is None and manifest.exists() and manifest.stat().st_mtime_ns != stamp:
                    up = time.monotonic()
                if up is not None and kill_after is not None and time.monotonic() - up >= kill_after:
                    break
                time.sleep(0.02)
            if proc.poll() is not None:
                return False, None if up is None else time.monotonic() - up, proc.returncode
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)  # the driver, its raylet/GCS and the workers in its group
                proc.wait()
            reap_session(proc.pid, ray_tmp)
        return up is not None and kill_after is not None, None if up is None else time.monotonic() - up, None


# ---- reading a run -------------------------------------------------------------------------
def _records(frame: Any) -> list[dict[str, Any]]:
    import math

    import pandas as pd

    out = []
    for row in frame.to_dict("records"):
        clean = {}
        for k, v in row.items():
            if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
                v = None
            elif hasattr(v, "tolist"):
                v = v.tolist()
            elif hasattr(v, "item"):
                v = v.item()
            clean[k] = v
        out.append(clean)
    return out


def snapshot(run_dir: Path) -> dict[str, Any]:
    """What the store holds now (a killed run's tables included)."""
    from milo_ray.results import load_run

    if not (run_dir / "manifest.json").exists():
        return {"rollouts": [], "harnesses": [], "agent_calls": [], "events": [], "manifest": {},
                "run_dir": str(run_dir)}
    res = load_run(run_dir)
    return {"rollouts": _records(res.rollouts), "harnesses": _records(res.harnesses),
            "agent_calls": _records(res.agent_calls),
            "events": _records(res.events.drop(columns=["data"])), "manifest": res.manifest,
            "run_dir": str(run_dir)}


def _stable(rows: list[dict[str, Any]], run_dir: str | None = None) -> Counter:
    """Rows as comparable text: volatile columns dropped, the run's own directory (which
    MILO's node payloads name) replaced by ``<run>``, events about a session rather than
    the run (``_SESSION_EVENTS``) left out, and the
    agents' wall seconds of a summary's ``spend_by_role`` dropped (its tokens are in
    ``agent_calls``, compared on their own)."""
    out: Counter = Counter()
    for r in rows:
        if r.get("kind") in _SESSION_EVENTS:
            continue
        if r.get("kind") and r.get("payload") and "spend_by_role" in r["payload"]:
            payload = json.loads(r["payload"])
            payload.pop("spend_by_role", None)
            r = {**r, "payload": json.dumps(payload, sort_keys=True)}
        text = json.dumps({k: v for k, v in r.items() if k not in _VOLATILE}, sort_keys=True, default=str)
        out[text.replace(run_dir, "<run>") if run_dir else text] += 1
    return out


# ---- checks ------------------------------------------------------------------------------------
def check(final: dict[str, Any], before: list[dict[str, Any]], reference: dict[str, Any] | None,
          breaks: frozenset[str] = frozenset()) -> list[str]:
    """Reasons the finished run fails; empty when it passes. ``before``: the snapshots taken
    after each kill."""
    bad: list[str] = []
    if final["manifest"].get("status") != "finished":
        bad.append(f"finished: manifest status {final['manifest'].get('status')!r}")
    keys = Counter(r["cache_key"] for r in final["rollouts"])
    dups = [k for k, n in keys.items() if n > 1]
    if dups and "ignore-duplicates" not in breaks:
        bad.append(f"duplicate_key: {len(dups)} cache keys stored twice (e.g. {dups[0]})")
    scores = {r["cache_key"]: r["score"] for r in final["rollouts"]}
    calls = Counter(r["call_id"] for r in final["agent_calls"])
    final_calls = {r["call_id"]: r for r in final["agent_calls"]}
    harness_rows = _stable(final["harnesses"])
    for i, snap in enumerate(before):
        lost = [r["cache_key"] for r in snap["rollouts"] if scores.get(r["cache_key"], object()) != r["score"]]
        if lost and "ignore-lost" not in breaks:
            bad.append(f"lost_rollout: kill {i + 1}: {len(lost)} stored rollouts missing or changed (e.g. {lost[0]})")
        changed = [r["call_id"] for r in snap["agent_calls"]
                   if (f := final_calls.get(r["call_id"])) is None
                   or (f["input_tokens"], f["output_tokens"], f["time"]) != (r["input_tokens"], r["output_tokens"], r["time"])]
        if changed and "ignore-calls" not in breaks:
            bad.append(f"repeated_call: kill {i + 1}: {len(changed)} stored agent calls missing or made again "
                       f"(e.g. {changed[0]})")
        gone = _stable(snap["harnesses"]) - harness_rows
        if gone and "ignore-lineage" not in breaks:
            bad.append(f"lineage: kill {i + 1}: {sum(gone.values())} stored harness rows missing or changed")
    twice = [c for c, n in calls.items() if n > 1]
    if twice and "ignore-calls" not in breaks:
        bad.append(f"repeated_call: {len(twice)} call ids stored twice (e.g. {twice[0]})")
    cap = (((final["manifest"].get("config") or {}).get("run") or {}).get("budget") or {}).get("executions")
    spent = sum(1 for r in final["rollouts"] if r.get("budgeted"))
    if cap is not None and spent > cap and "ignore-budget" not in breaks:
        bad.append(f"budget: {spent} budgeted executions > run.budget.executions={cap}")
    if "ignore-lineage" not in breaks:
        ids = Counter(r["harness_id"] for r in final["harnesses"])
        # A harness may sit on several islands (a graft or speciation copies a node); the
        # same row twice is a duplicate.
        if any(n > 1 for n in _stable(final["harnesses"]).values()):
            bad.append("lineage: a harness row is stored twice")
        for r in final["harnesses"]:
            for col in ("parent_id", "co_parent_id"):
                if r.get(col) and r[col] not in ids:
                    bad.append(f"lineage: {r['harness_id']}'s {col} {r[col]} is not a stored harness")
                    break
    if reference is not None and "ignore-tables" not in breaks:
        for table in ("rollouts", "harnesses", "agent_calls", "events"):
            a, b = _stable(final[table], final.get("run_dir")), _stable(reference[table], reference.get("run_dir"))
            if a != b:
                extra, missing = sum((a - b).values()), sum((b - a).values())
                sample = next(iter((a - b) or (b - a)))[:300]
                bad.append(f"equal_tables: {table}: {extra} rows not in the uninterrupted run, "
                           f"{missing} of its rows missing (e.g. {sample})")
    return bad


# ---- trials ------------------------------------------------------------------------------------
@dataclass
class Trial:
    method: str
    index: int
    kills: int = 0
    kill_times: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    sessions: list[float] = field(default_factory=list)  # seconds of each driver session
    seconds: float = 0.0


def reference_run(spec: MethodSpec, out: Path, run_seed: int) -> tuple[dict[str, Any], float]:
    run_dir = out / spec.name / f"reference-seed{run_seed}"
    cached = run_dir / "reference.json"
    if cached.exists():
        data = json.loads(cached.read_text())
        return {**data["snapshot"], "run_dir": str(run_dir)}, data["seconds"]
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    killed, seconds, code = _session([*spec.args, *QUIET, f"run.seed={run_seed}", f"run.dir={run_dir}"],
                                     run_dir=run_dir, ray_tmp=_ray_tmp(f"{spec.name}-ref{run_seed}"),
                                     log=run_dir.parent / f"reference-seed{run_seed}.log", kill_after=None)
    if code != 0:
        raise RuntimeError(f"{spec.name}: the uninterrupted run failed (exit {code}); see "
                           f"{run_dir.parent / f'reference-seed{run_seed}.log'}")
    snap = snapshot(run_dir)
    cached.write_text(json.dumps({"snapshot": snap, "seconds": seconds}, default=str))
    return {**json.loads(cached.read_text())["snapshot"], "run_dir": str(run_dir)}, seconds


def run_trial(spec: MethodSpec, index: int, *, out: Path, seed: int, run_seed: int, max_kills: int,
              reference: dict[str, Any], ref_seconds: float, breaks: frozenset[str]) -> Trial:
    rng = random.Random(f"{seed}:{spec.name}:{index}")
    trial = Trial(spec.name, index)
    run_dir = out / spec.name / f"trial-{index}"
    log = out / spec.name / f"trial-{index}.log"
    ray_tmp = _ray_tmp(f"{spec.name}-{index}")
    t0 = time.monotonic()
    before: list[dict[str, Any]] = []
    argv = [*spec.args, *QUIET, f"run.seed={run_seed}", f"run.dir={run_dir}"]
    for k in range(max_kills):
        # Kill anywhere in the uninterrupted run's span after start-up (a session that
        # finishes first ends the trial with fewer kills).
        delay = rng.uniform(0.1, 0.9) * ref_seconds
        killed, took, code = _session(argv, run_dir=run_dir, ray_tmp=ray_tmp, log=log, kill_after=delay)
        trial.sessions.append(round(took, 1))
        if not killed:
            if code != 0:
                trial.failures.append(f"session {k + 1} exited {code} (see {log})")
            break
        trial.kills += 1
        trial.kill_times.append(round(delay, 2))
        before.append(snapshot(run_dir))
        argv = [f"run.resume={run_dir}", *QUIET]
    else:
        _, took, code = _session(argv, run_dir=run_dir, ray_tmp=ray_tmp, log=log, kill_after=None)
        trial.sessions.append(round(took, 1))
        if code != 0:
            trial.failures.append(f"final resume exited {code} (see {log})")
    if not trial.failures:
        trial.failures = check(snapshot(run_dir), before, reference if spec.deterministic else None, breaks)
    trial.seconds = time.monotonic() - t0
    return trial


def summarize(trials: list[Trial]) -> str:
    rows = ["| method | trials | kills | passes | failures |", "|---|---|---|---|---|"]
    for name in dict.fromkeys(t.method for t in trials):
        mine = [t for t in trials if t.method == name]
        failed = [t for t in mine if t.failures]
        reasons = Counter(f.split(":")[0] for t in failed for f in t.failures)
        rows.append(f"| {name} | {len(mine)} | {sum(t.kills for t in mine)} | {len(mine) - len(failed)} | "
                    f"{len(failed)}{' (' + ', '.join(f'{r} x{n}' for r, n in reasons.items()) + ')' if failed else ''} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--out", type=Path, default=Path("/tmp/kill_trials"))
    ap.add_argument("--max-kills", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0, help="seeds the kill times")
    ap.add_argument("--run-seeds", type=int, default=1,
                    help="distinct run.seed values (trial i uses i %% N); one uninterrupted run each")
    ap.add_argument("--jobs", type=int, default=1, help="trials run at once (each with its own Ray)")
    ap.add_argument("--break", dest="breaks", action="append", default=[], choices=BREAKS)
    args = ap.parse_args(argv)
    names = [m for m in args.methods.split(",") if m]
    unknown = [m for m in names if m not in METHODS]
    if unknown:
        ap.error(f"--methods: unknown {unknown}; choose from {sorted(METHODS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    trials: list[Trial] = []
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        seeds = range(args.run_seeds)
        ref_futures = {(n, s): pool.submit(reference_run, METHODS[n], args.out, s) for n in names for s in seeds}
        refs = {key: f.result() for key, f in ref_futures.items()}
        futures = [pool.submit(run_trial, METHODS[n], i, out=args.out, seed=args.seed, run_seed=i % args.run_seeds,
                               max_kills=args.max_kills, reference=refs[n, i % args.run_seeds][0],
                               ref_seconds=refs[n, i % args.run_seeds][1], breaks=frozenset(args.breaks))
                   for i in range(args.trials) for n in names]  # interleaved: a cut-short run covers every method
        for f in as_completed(futures):
            t = f.result()
            trials.append(t)
            # Written as trials finish: a run cut short still leaves its results.
            (args.out / "results.json").write_text(json.dumps([vars(x) for x in trials], indent=1))
            status = "PASS" if not t.failures else "FAIL " + "; ".join(t.failures)
            print(f"{t.method} trial {t.index}: {t.kills} kills at {t.kill_times} s, sessions {t.sessions} s, "
                  f"{t.seconds:.0f} s: {status}", flush=True)
    trials.sort(key=lambda t: (names.index(t.method), t.index))
    print(summarize(trials))
    (args.out / "results.json").write_text(json.dumps([vars(t) for t in trials], indent=1))
    return 1 if any(t.failures for t in trials) else 0


if __name__ == "__main__":
    sys.exit(main())
