"""Load soak: N surrogate rollouts through the RolloutScheduler with a fraction of
attempts failing as injected infrastructure faults, into a Parquet run store.

    python scripts/soak.py                       # 20,000 rollouts, 5% faults
    python scripts/soak.py --rollouts 4000 --fault-rate 0.05 --batch 1000

Rollouts go in batches (as a method submits a round); after each batch the driver's RSS
and the batch's throughput are sampled. Checks, printed with their figures (exit 1 when
one fails):

* nothing lost: the store holds every requested rollout exactly once (one row per cache
  key), none of them an unretried fault, and the injected faults show up as
  ``rollout_retry`` events;
* memory: driver RSS growth from rollout ``--warm`` (2,000) to the end < 100 MB;
* throughput: the last quarter's rollouts/s within 10% of the first quarter's (the first
  quarter is measured after the first batch, which starts the workers), and the driver's
  CPU time per rollout likewise (the load-independent form of the same check: on a shared
  machine the wall figure moves with other processes).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from milo_ray.benchmarks.surrogate import SurrogateBenchmark  # noqa: E402
from milo_ray.core.rollouts import RolloutRequest  # noqa: E402
from milo_ray.execution.budget import BudgetLedger  # noqa: E402
from milo_ray.execution.scheduler import RolloutScheduler  # noqa: E402
from milo_ray.store import ParquetRunStore  # noqa: E402


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def soak(run_dir: Path, *, rollouts: int, fault_rate: float, batch: int, warm: int, slots: int,
         preset: str = "surrogate_tb21") -> dict:
    bench = SurrogateBenchmark(preset=preset)
    harnesses = bench.seed_harnesses()
    tasks = bench.tasks("test")
    executor = {"_target_": "milo_ray.testing.faulty_executor.FaultInjectingExecutor",
                "inner": bench.executor_config(), "rate": fault_rate, "seed": 0}
    store = ParquetRunStore(run_dir, run_id="soak")
    sched = RolloutScheduler(executor, tasks, store, model_id="offline", run_id="soak", budget=BudgetLedger(),
                             slots_per_node=slots, max_retries=5, retry_backoff_s=0.0, progress=False)
    for h in harnesses:
        sched.add_harness(h)
    # Every (harness, task, rollout index) once: rollout_idx grows until N are requested.
    per_idx = len(harnesses) * len(tasks)
    requests = [RolloutRequest(harnesses[(i // len(tasks)) % len(harnesses)].harness_id,
                               tasks[i % len(tasks)].task_id, i // per_idx, seed=0) for i in range(rollouts)]
    # (done, wall seconds of this batch, rss MB after it, driver CPU seconds of the batch)
    samples: list[tuple[int, float, float, float]] = []
    infra_rows = 0
    done = 0
    for start in range(0, rollouts, batch):
        chunk = requests[start:start + batch]
        t0, c0 = time.perf_counter(), time.process_time()
        results = sched.run(chunk)
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        infra_rows += sum(1 for r in results if r.error_kind == "infra")
        done += len(results)
        samples.append((done, seconds, rss_mb(), cpu))
        print(f"  {done:>6} rollouts  {len(chunk) / seconds:7.1f}/s  driver cpu {1e3 * cpu / len(chunk):5.2f} ms/rollout"
              f"  rss {samples[-1][2]:7.1f} MB", flush=True)
    sched.close()
    store.flush()
    rows = store.read("rollouts")
    keys = Counter(rows.column("cache_key").to_pylist())
    retries = sum(1 for k in store.read("events").column("kind").to_pylist() if k == "rollout_retry")
    store.close()

    first = [s for s in samples[1:] if s[0] <= samples[0][0] + (rollouts - samples[0][0]) / 4] or samples[1:2]
    last = [s for s in samples if s[0] > rollouts - rollouts / 4]
    rate = lambda part: sum(batch for _ in part) / sum(s[1] for s in part)  # noqa: E731
    cpu_ms = lambda part: 1e3 * sum(s[3] for s in part) / sum(batch for _ in part)  # noqa: E731
    at_warm = next(s[2] for s in samples if s[0] >= warm)
    return {"rollouts": rollouts, "stored_rows": rows.num_rows, "distinct_keys": len(keys),
            "duplicated_keys": sum(1 for n in keys.values() if n > 1), "infra_rows": infra_rows,
            "retries": retries, "fault_rate": fault_rate, "rss_at_warm_mb": at_warm, "rss_end_mb": samples[-1][2],
            "rss_growth_mb": samples[-1][2] - at_warm, "first_quarter_per_s": rate(first),
            "last_quarter_per_s": rate(last), "first_quarter_cpu_ms": cpu_ms(first),
            "last_quarter_cpu_ms": cpu_ms(last)}


def verdicts(r: dict) -> list[tuple[str, bool, str]]:
    ratio = r["last_quarter_per_s"] / r["first_quarter_per_s"]
    return [
        ("nothing lost", r["stored_rows"] == r["distinct_keys"] == r["rollouts"] and r["infra_rows"] == 0,
         f"{r['stored_rows']} rows, {r['distinct_keys']} keys of {r['rollouts']}, {r['duplicated_keys']} duplicated, "
         f"{r['infra_rows']} unretried faults, {r['retries']} retries ({r['retries'] / r['rollouts']:.1%})"),
        ("faults were injected", r["retries"] >= 0.5 * r["fault_rate"] * r["rollouts"], f"{r['retries']} retries"),
        ("memory growth < 100 MB", r["rss_growth_mb"] < 100,
         f"{r['rss_at_warm_mb']:.1f} MB -> {r['rss_end_mb']:.1f} MB ({r['rss_growth_mb']:+.1f} MB)"),
        ("last quarter within 10% of the first", ratio >= 0.9,
         f"first {r['first_quarter_per_s']:.1f}/s, last {r['last_quarter_per_s']:.1f}/s ({ratio:.3f})"),
        # Wall throughput moves with whatever else the machine runs; the driver's CPU per
        # rollout does not, so a drift in the scheduler or store shows here even when the
        # wall figure is noise.
        ("driver CPU per rollout within 10%", r["last_quarter_cpu_ms"] <= 1.1 * r["first_quarter_cpu_ms"],
         f"first {r['first_quarter_cpu_ms']:.3f} ms, last {r['last_quarter_cpu_ms']:.3f} ms"),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rollouts", type=int, default=20_000)
    ap.add_argument("--fault-rate", type=float, default=0.05)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--warm", type=int, default=2000, help="rollouts done when memory growth starts counting")
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--num-cpus", type=int, default=2)
    ap.add_argument("--dir", type=Path, default=None, help="run directory (default: a temporary one)")
    args = ap.parse_args(argv)
    if args.rollouts < 4 * args.batch or args.warm > args.rollouts:
        ap.error("--rollouts must be >= 4 x --batch and >= --warm (a quarter needs a whole batch)")
    from milo_ray.execution.cluster import start_local

    for attempt in range(3):  # on a loaded machine Ray's start-up can time out
        try:
            start_local(num_cpus=args.num_cpus, slots=args.slots, configure_logging=False)
            break
        except Exception as exc:  # noqa: BLE001 - Ray raises a bare Exception for this
            if attempt == 2 or "timed out during startup" not in str(exc):
                raise
            import ray

            ray.shutdown()
            print(f"Ray did not start ({exc}); trying again", flush=True)
    with tempfile.TemporaryDirectory(prefix="soak_") as tmp:
        result = soak(args.dir or Path(tmp) / "run", rollouts=args.rollouts, fault_rate=args.fault_rate,
                      batch=args.batch, warm=args.warm, slots=args.slots)
    ok = True
    for name, passed, detail in verdicts(result):
        ok &= passed
        print(f"{'ok  ' if passed else 'FAIL'} {name}: {detail}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
