"""The driver past one machine, by simulation: the real dispatch rules and the real store
writer, fed by a simulated cluster.

The scheduler's driver does two things per rollout that grow with the cluster: it picks
where a queued rollout runs (:class:`~milo_ray.execution.dispatch.Dispatch`) and it stores
the finished result (``ParquetRunStore.append_rollouts``, the single writer). This script
drives both, as the scheduler calls them, without Ray:

1. **Dispatch.** A cluster of ``--nodes`` nodes with ``--slots`` sandbox slots each (one
   rollout worker per node, holding all its slots: the pool's default), and ``--rollouts``
   queued rollouts in ``--groups`` groups (runs x stages: ``run07/stage2``). Group sizes
   are lognormal (a few large groups, many small ones); a quarter of the groups arrive at
   t=0, the others uniformly over the first half of the expected makespan, each submitting
   all its rollouts at once. Rollout durations are lognormal (``--median-s``,
   ``--sigma``), cut at ``--cap-s`` (the task's time cap); everything is drawn from one
   seeded generator (``--seed``). Every arrival and every finished rollout is one pump,
   as in ``RolloutScheduler._pump``: ``done()`` for the finished rollout, ``pick()`` with
   the workers' free slots, ``runnable()`` to size the pool. The time of a pump is divided
   among the rollouts it placed (the time per dispatch decision). The same event stream
   is replayed through a trivial FIFO (one deque, popped onto any free slot): the
   baseline for speed, and a policy with no fairness at all.
2. **Fairness.** Each group's wait, counted in dispatch decisions (the dispatches the
   cluster made between the group's arrival and its last rollout's dispatch), against its
   fair share: the wait it would have had if every dispatch of the run had been split
   equally among the groups with rollouts queued at that moment (fluid round-robin).
3. **Store.** The first ``--store-rows`` simulated results, each with its own ~2 KB trace
   (so each one is a blob), filled in by the scheduler's own ``fill_bookkeeping`` and
   appended to a ``ParquetRunStore`` in the batches the scheduler's polls would hand it
   (one worker's rollouts finished within one 1-s poll), then flushed: rows, blobs and
   the hash list of part files. The baseline writes the same rows (without blobs) with
   pyarrow directly, one zstd part per 2,000 rows (the store's ``flush_rows``).
4. **The pool's scan.** Each pump first asks the worker pool for the free slots
   (``WorkerPool.free_slots``), a scan over every worker. It is timed on its own, on
   ``--nodes`` real ``WorkerHandle`` objects of a busy cluster (one free slot), and
   added per pump to the driver's capacity.
5. **Memory.** The driver's peak RSS (it holds every queued ``RolloutRequest``), and,
   measured apart with tracemalloc, what the scheduler adds per queued rollout (its job
   record, asyncio future and cache key), projected to ``--rollouts``.

    python scripts/bench_dispatch_scale.py                  # 1,000 x 8 slots, 1,000,000 rollouts, 100 groups
    python scripts/bench_dispatch_scale.py --nodes 10 --rollouts 2000 --groups 8 --store-rows 500
"""

from __future__ import annotations

import argparse
import cProfile
import heapq
import json
import math
import os
import pstats
import resource
import shutil
import sys
import tempfile
import time
import types
from array import array
from collections import deque
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from milo_ray.core.rollouts import RolloutRequest, RolloutResult
from milo_ray.execution.dispatch import Dispatch
from milo_ray.execution.outcomes import fill_bookkeeping
from milo_ray.store import ParquetRunStore, schema

POLL_S = 1.0  # the scheduler's long poll (scheduler._POLL_WAIT_S): one store append per worker poll
FLUSH_ROWS = 2000  # ParquetRunStore's default flush_rows: the baseline writes parts of this size
TARGET_DECISION_US = 10.0
TARGET_FAIR_RATIO = 2.0
TARGET_ROWS_PER_S = 50_000.0
_WORDS = ("run", "the", "tests", "edit", "file", "patch", "import", "error", "assert", "pass", "fail", "diff",
          "grep", "python", "module", "function", "return", "value", "check", "build", "agent", "tool", "call")


@dataclass
class Scenario:
    nodes: int
    slots: int
    groups: list[str]
    sizes: np.ndarray  # rollouts per group
    arrivals: list[tuple[float, int]]  # (simulated seconds, group index), in time order
    durations: np.ndarray  # simulated seconds of rollout i (its rollout_idx)
    requests: list[list[RolloutRequest]]  # per group, in submission order
    seed: int

    @property
    def workers(self) -> list[str]:
        return [f"node-{i:04d}" for i in range(self.nodes)]


def make_scenario(nodes: int, slots: int, rollouts: int, groups: int, *, median_s: float, sigma: float,
                  cap_s: float, seed: int) -> Scenario:
    rng = np.random.default_rng(seed)
    names = [f"run{g // 4:02d}/stage{g % 4}" for g in range(groups)]
    weights = rng.lognormal(0.0, 1.0, groups)
    sizes = 1 + rng.multinomial(rollouts - groups, weights / weights.sum())
    durations = np.minimum(rng.lognormal(math.log(median_s), sigma, rollouts), cap_s)
    makespan = rollouts * float(durations.mean()) / (nodes * slots)
    at_start = max(1, groups // 4)
    times = np.concatenate([np.zeros(at_start), rng.uniform(0.0, 0.5 * makespan, groups - at_start)])
    arrivals = sorted(zip(times.tolist(), rng.permutation(groups).tolist()))
    tasks = [f"task-{t:03d}" for t in range(500)]  # shared strings, as the scheduler's tasks are
    requests, idx = [], 0
    for g, name in enumerate(names):
        harness = f"h{g:03d}"
        requests.append([RolloutRequest(harness, tasks[i % 500], i, seed, split="search", method="milo",
                                        round=1, stage=name, group=name) for i in range(idx, idx + int(sizes[g]))])
        idx += int(sizes[g])
    return Scenario(nodes, slots, names, sizes, arrivals, durations, requests, seed)


class FifoPop:
    """The baseline: one queue for every group, popped onto whichever slot is free."""

    def __init__(self) -> None:
        self._queue: deque = deque()

    def submit(self, group: str, item) -> None:
        self._queue.append(item)

    def done(self, group: str) -> None:
        pass

    def runnable(self) -> int:
        return len(self._queue)

    def pick(self, free: dict[str, int]) -> list:
        queue, picks = self._queue, []
        for node, n in free.items():
            for _ in range(min(n, len(queue))):
                picks.append((node, queue.popleft()))
            if not queue:
                break
        return picks


@dataclass
class SimResult:
    pump_ns: dict[str, array]  # "cpu" / "wall": time of each pump that placed rollouts
    pump_placed: array  # rollouts it placed
    idle_pump_ns: dict[str, int]  # "cpu" / "wall": total time of the pumps that placed nothing
    pumps: int  # every pump, placing or not
    decisions: int
    arrival_decision: list[int]  # per group: decisions made before it arrived
    last_decision: list[int]  # per group: the decision that placed its last rollout
    finished: list[tuple[str, RolloutRequest, float, float]]  # the first rollouts to finish: (worker, request, start, end)
    sim_seconds: float


def simulate(policy, sc: Scenario, keep: int) -> SimResult:
    """Run every rollout of ``sc`` through ``policy`` on the simulated cluster."""
    free = {w: sc.slots for w in sc.workers}  # the pool's free_slots(): only workers with a free slot
    group_index = {name: g for g, name in enumerate(sc.groups)}
    durations = sc.durations
    running: list[tuple[float, int, str, RolloutRequest, float]] = []  # (end, seq, worker, request, start)
    cpu_ns, wall_ns, pump_placed = array("q"), array("q"), array("q")
    idle_cpu = idle_wall = 0
    cpu_cost, wall_cost = clock_costs()
    arrival_decision = [0] * len(sc.groups)
    last_decision = [-1] * len(sc.groups)
    finished: list[tuple[str, RolloutRequest, float, float]] = []
    decision = seq = ai = idle_pumps = 0
    now = 0.0
    cpu, wall = time.thread_time_ns, time.perf_counter_ns
    while ai < len(sc.arrivals) or running:
        done_group = None
        if ai < len(sc.arrivals) and (not running or sc.arrivals[ai][0] <= running[0][0]):
            now, g = sc.arrivals[ai]
            ai += 1
            arrival_decision[g] = decision
            name = sc.groups[g]
            for request in sc.requests[g]:
                policy.submit(name, request)
        else:
            now, _, worker, request, started = heapq.heappop(running)
            free[worker] = free.get(worker, 0) + 1
            done_group = request.group
            if len(finished) < keep:
                finished.append((worker, request, started, now))
        w0 = wall()
        c0 = cpu()
        if done_group is not None:
            policy.done(done_group)
        picks = policy.pick(free)
        policy.runnable()
        c1 = cpu()
        w1 = wall()
        pump_cpu, pump_wall = max(c1 - c0 - cpu_cost, 0), max(w1 - w0 - wall_cost, 0)
        if not picks:
            idle_cpu += pump_cpu
            idle_wall += pump_wall
            idle_pumps += 1
            continue
        cpu_ns.append(pump_cpu)
        wall_ns.append(pump_wall)
        pump_placed.append(len(picks))
        for worker, request in picks:
            left = free[worker] - 1
            if left:
                free[worker] = left
            else:
                del free[worker]
            heapq.heappush(running, (now + durations[request.rollout_idx], seq, worker, request, now))
            seq += 1
            last_decision[group_index[request.group]] = decision
            decision += 1
    pumps = len(pump_placed) + idle_pumps
    return SimResult({"cpu": cpu_ns, "wall": wall_ns}, pump_placed, {"cpu": idle_cpu, "wall": idle_wall}, pumps, decision, arrival_decision, last_decision, finished, now)


def clock_costs(samples: int = 2000) -> tuple[int, int]:
    """(CPU, wall) nanoseconds the timing itself adds to a pump's interval: the median of
    the same clock calls around nothing (subtracted from every pump)."""
    cpu, wall = time.thread_time_ns, time.perf_counter_ns
    cpu_d, wall_d = [], []
    for _ in range(samples):
        w0 = wall()
        c0 = cpu()
        c1 = cpu()
        w1 = wall()
        cpu_d.append(c1 - c0)
        wall_d.append(w1 - w0)
    return int(np.median(cpu_d)), int(np.median(wall_d))


def decision_us(sim: SimResult, clock: str) -> tuple[float, float]:
    """(mean, p99) microseconds per placed rollout on ``clock`` ("cpu": this thread's CPU
    time, which leaves out the time other processes held the core; "wall"); each rollout
    is charged its pump's time divided by the rollouts that pump placed, the pumps that
    placed none spread over all (they count in the mean, not in the p99)."""
    ns = np.frombuffer(sim.pump_ns[clock], dtype=np.int64).astype(float)
    placed = np.frombuffer(sim.pump_placed, dtype=np.int64)
    mean = (ns.sum() + sim.idle_pump_ns[clock]) / max(sim.decisions, 1) / 1e3
    per = np.repeat(ns / placed, placed) / 1e3
    return mean, float(np.percentile(per, 99)) if len(per) else 0.0


def fair_finish(arrival_decision: list[int], sizes: np.ndarray) -> list[float]:
    """Per group, the decision count at which its last rollout would be dispatched if
    each dispatch were split equally among the groups with rollouts queued (fluid
    round-robin), given the groups' arrivals on the same decision clock."""
    order = sorted(range(len(sizes)), key=lambda g: arrival_decision[g])
    left: dict[int, float] = {}
    finish = [0.0] * len(sizes)
    clock, i = 0.0, 0
    while i < len(order) or left:
        next_arrival = arrival_decision[order[i]] if i < len(order) else math.inf
        if not left:
            clock = max(clock, next_arrival)
        while i < len(order) and arrival_decision[order[i]] <= clock:
            left[order[i]] = float(sizes[order[i]])
            i += 1
            next_arrival = arrival_decision[order[i]] if i < len(order) else math.inf
        k = len(left)
        smallest = min(left.values())
        step = min(smallest, (next_arrival - clock) / k)
        clock += step * k
        for g in list(left):
            left[g] -= step
            if left[g] <= 1e-9:
                del left[g]
                finish[g] = clock
    return finish


def fairness(sim: SimResult, sc: Scenario) -> tuple[float, str]:
    """The worst group's wait over its fair share (both in dispatch decisions), and its name."""
    fair = fair_finish(sim.arrival_decision, sc.sizes)
    worst, who = 0.0, ""
    for g, name in enumerate(sc.groups):
        waited = sim.last_decision[g] + 1 - sim.arrival_decision[g]
        ratio = waited / (fair[g] - sim.arrival_decision[g])
        if ratio > worst:
            worst, who = ratio, name
    return worst, who


def _trace(rng: np.random.Generator, i: int) -> dict:
    """A ~2 KB trace of its own (distinct content: one blob per rollout)."""
    steps = [{"role": "assistant", "tool": "bash", "step": k,
              "text": " ".join(_WORDS[j] for j in rng.integers(0, len(_WORDS), 40)) + f" #{i}.{k}"}
             for k in range(6)]
    return {"trajectory": steps, "ctrf": {"tests": 10, "passed": int(rng.integers(0, 11))}}


def poll_batches(finished: list[tuple[str, RolloutRequest, float, float]]) -> list[list[int]]:
    """Indices into ``finished`` grouped as the scheduler's polls deliver them: one
    worker's rollouts that finished within one poll window, in the order the windows open."""
    batches: dict[tuple[str, int], list[int]] = {}
    for i, (worker, _, _, end) in enumerate(finished):
        batches.setdefault((worker, int(end // POLL_S)), []).append(i)
    return list(batches.values())


def store_rate(sc: Scenario, finished, root: str, profile: cProfile.Profile | None) -> dict[str, float]:
    """Rows per second of the store, on the wall clock and per CPU second of this thread (a
    part the store's background flusher writes is not in the latter; ``time.process_time``
    would count it, but reading it costs more than a row once pyarrow's threads exist),
    and of the pyarrow baseline (wall clock); the appends and the mean rows per append."""
    rng = np.random.default_rng([sc.seed, 1])
    store = ParquetRunStore(os.path.join(root, "run"), run_id="scale-bench")
    batches = poll_batches(finished)
    rows, spent, spent_cpu = [], 0.0, 0.0
    for batch in batches:
        results = []
        for i in batch:
            worker, request, started, ended = finished[i]
            n_tests = 10
            passed = int(rng.integers(0, n_tests + 1))
            result = RolloutResult(request.harness_id, request.task_id, request.rollout_idx, score=passed / n_tests,
                                   input_tokens=int(rng.integers(10_000, 200_000)),
                                   output_tokens=int(rng.integers(1_000, 20_000)), trace=_trace(rng, i))
            results.append(fill_bookkeeping(result, request, run_id="scale-bench", split=request.split, node=worker,
                                            started=started, finished=ended, cache_key=f"key-{request.rollout_idx:09d}",
                                            attempts=1, budgeted=True, usd_per_mtok=(3.0, 15.0)))
        if profile is not None:
            profile.enable()
        c0, t0 = time.thread_time(), time.perf_counter()
        store.append_rollouts(results)
        spent += time.perf_counter() - t0
        spent_cpu += time.thread_time() - c0
        if profile is not None:
            profile.disable()
        rows.extend(r.row() for r in results)
    c0, t0 = time.thread_time(), time.perf_counter()
    store.close()  # the last flush: its rows, its part's hash line
    spent += time.perf_counter() - t0
    spent_cpu += time.thread_time() - c0
    base_dir = os.path.join(root, "pyarrow")
    os.makedirs(base_dir)
    sch = schema.SCHEMAS["rollouts"]
    t0 = time.perf_counter()
    for part, start in enumerate(range(0, len(rows), FLUSH_ROWS)):
        table = pa.Table.from_pylist(rows[start:start + FLUSH_ROWS], schema=sch)
        pq.write_table(table, os.path.join(base_dir, f"part-{part:08d}.parquet"), compression="zstd")
    base = time.perf_counter() - t0
    return {"wall": len(rows) / spent, "cpu": len(rows) / max(spent_cpu, 1e-9), "pyarrow": len(rows) / base,
            "appends": len(batches), "per_append": len(rows) / max(len(batches), 1)}


def pool_scan_us(nodes: int, slots: int, repeats: int = 300) -> dict[str, float]:
    """Microseconds (thread CPU, wall) of one ``WorkerPool.free_slots`` call over ``nodes``
    ready workers of ``slots`` slots, all busy but one slot (the scheduler's steady state)."""
    from milo_ray.execution.pool import WorkerPool  # imports Ray (not started)
    from milo_ray.execution.workers import WorkerHandle

    workers = {}
    for i in range(nodes):
        w = WorkerHandle(key=f"w{i:04d}", slots=slots, actor=object(), ready=True, label=f"node-{i:04d}")
        w.inflight = dict.fromkeys(range(slots - 1 if i == 0 else slots))
        workers[w.key] = w
    pool = types.SimpleNamespace(workers=workers)  # free_slots reads only .workers
    c0, t0 = time.thread_time(), time.perf_counter()
    for _ in range(repeats):
        WorkerPool.free_slots(pool)  # type: ignore[arg-type]
    return {"cpu": (time.thread_time() - c0) / repeats * 1e6, "wall": (time.perf_counter() - t0) / repeats * 1e6}


def job_bytes(n: int = 5_000) -> float:
    """Bytes the scheduler holds per queued rollout: the request, its cache key, its
    ``_Job`` with an asyncio future, and the ``_jobs`` entry (tracemalloc, ``n`` of them)."""
    import asyncio
    import tracemalloc

    from milo_ray.execution.budget import BudgetLedger
    from milo_ray.execution.scheduler import _Job

    loop, ledger, jobs = asyncio.new_event_loop(), BudgetLedger(), {}
    try:
        tracemalloc.start()
        for i in range(n):
            request = RolloutRequest("h001", "task-001", i, 0, split="search", method="milo", round=1,
                                     stage="run01/stage1", group="run01/stage1")
            key = request.key("model")
            jobs[key] = _Job(key, request, loop.create_future(), ledger)
        used = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
        loop.close()
    return used / n


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: kilobytes


def _profile_text(profile: cProfile.Profile, lines: int = 18) -> str:
    import io
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(lines)
    return out.getvalue()


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1000, help="simulated nodes (one rollout worker each)")
    ap.add_argument("--slots", type=int, default=8, help="sandbox slots per node")
    ap.add_argument("--rollouts", type=int, default=1_000_000, help="rollouts queued over the run")
    ap.add_argument("--groups", type=int, default=100, help="concurrent groups (runs x stages)")
    ap.add_argument("--store-rows", type=int, default=50_000, help="finished rollouts appended to the store")
    ap.add_argument("--median-s", type=float, default=120.0, help="median simulated rollout duration, seconds")
    ap.add_argument("--sigma", type=float, default=1.0, help="lognormal sigma of the rollout durations")
    ap.add_argument("--cap-s", type=float, default=3600.0, help="time cap: no simulated rollout runs longer")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", action="store_true", help="print cProfile's top functions of Dispatch and the store")
    ap.add_argument("--json", metavar="PATH", help="also write the figures to PATH as JSON")
    args = ap.parse_args(argv)
    for name in ("nodes", "slots", "rollouts", "groups", "store_rows"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")
    if args.groups > args.rollouts:
        ap.error(f"--groups ({args.groups}) must not exceed --rollouts ({args.rollouts}): every group queues a rollout")
    if not (args.median_s > 0 and args.sigma >= 0 and args.cap_s > 0):
        ap.error("--median-s and --cap-s must be > 0 and --sigma >= 0")

    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    sc = make_scenario(args.nodes, args.slots, args.rollouts, args.groups, median_s=args.median_s, sigma=args.sigma,
                       cap_s=args.cap_s, seed=args.seed)
    setup_s = time.perf_counter() - t0
    profile = cProfile.Profile() if args.profile else None
    if profile is not None:
        profile.enable()
    sim = simulate(Dispatch(), sc, keep=args.store_rows)
    if profile is not None:
        profile.disable()
        print("--- cProfile: the Dispatch simulation (simulator included) ---\n" + _profile_text(profile))
    rss_dispatch = _rss_mb()
    fifo = simulate(FifoPop(), sc, keep=0)
    us = {clock: decision_us(sim, clock) for clock in ("cpu", "wall")}
    fifo_us = {clock: decision_us(fifo, clock) for clock in ("cpu", "wall")}
    mean_us, p99_us = us["cpu"]
    fifo_mean_us, fifo_p99_us = fifo_us["cpu"]
    worst, worst_group = fairness(sim, sc)
    fifo_worst, fifo_worst_group = fairness(fifo, sc)
    root = tempfile.mkdtemp(prefix="bench-dispatch-scale-")
    store_profile = cProfile.Profile() if args.profile else None
    try:
        store = store_rate(sc, sim.finished, root, store_profile)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if store_profile is not None:
        print("--- cProfile: ParquetRunStore.append_rollouts + close ---\n" + _profile_text(store_profile))
    scan = pool_scan_us(args.nodes, args.slots)
    per_job = job_bytes()
    peak = _rss_mb()

    slots = args.nodes * args.slots
    mean_dur = float(sc.durations.mean())
    demand = slots / mean_dur  # rollouts finishing per second with every slot busy
    pumps_per_rollout = sim.pumps / sim.decisions
    # What the driver's thread spends per rollout, on CPU (a core to itself) and on the wall clock.
    driver_cap = {clock: 1.0 / ((us[clock][0] + scan[clock] * pumps_per_rollout) * 1e-6 + 1.0 / store[clock])
                  for clock in ("cpu", "wall")}
    figures = {
        "scenario": {"nodes": args.nodes, "slots_per_node": args.slots, "rollouts": args.rollouts,
                     "groups": args.groups, "seed": args.seed, "median_s": args.median_s, "sigma": args.sigma,
                     "cap_s": args.cap_s, "mean_duration_s": mean_dur, "largest_group": int(sc.sizes.max()),
                     "smallest_group": int(sc.sizes.min()), "simulated_s": sim.sim_seconds, "setup_s": setup_s,
                     "load_average_1min": [load_before, os.getloadavg()[0]], "cores": os.cpu_count()},
        "decision_us_mean": mean_us, "decision_us_p99": p99_us,
        "fifo_decision_us_mean": fifo_mean_us, "fifo_decision_us_p99": fifo_p99_us,
        "wall_decision_us_mean": us["wall"][0], "wall_decision_us_p99": us["wall"][1],
        "wall_fifo_decision_us_mean": fifo_us["wall"][0], "wall_fifo_decision_us_p99": fifo_us["wall"][1],
        "decisions_per_s": 1e6 / mean_us, "fifo_decisions_per_s": 1e6 / fifo_mean_us,
        "worst_fair_share_ratio": worst, "worst_group": worst_group,
        "fifo_worst_fair_share_ratio": fifo_worst, "fifo_worst_group": fifo_worst_group,
        "store_rows_per_s": store["wall"], "store_rows_per_cpu_s": store["cpu"], "pyarrow_rows_per_s": store["pyarrow"],
        "store_rows": len(sim.finished), "store_appends": store["appends"], "rows_per_append": store["per_append"],
        "pool_scan_us": scan["cpu"], "wall_pool_scan_us": scan["wall"], "pumps_per_rollout": pumps_per_rollout,
        "scheduler_bytes_per_queued_rollout": per_job,
        "rss_mb_after_dispatch": rss_dispatch, "rss_mb_peak": peak,
        "cluster_demand_rollouts_per_s": demand, "driver_rollouts_per_s": driver_cap["cpu"],
        "wall_driver_rollouts_per_s": driver_cap["wall"],
    }

    s = figures["scenario"]
    print(f"Simulated cluster: {args.nodes:,} nodes x {args.slots} slots = {slots:,} slots; {args.rollouts:,} rollouts "
          f"in {args.groups} groups ({s['smallest_group']:,} to {s['largest_group']:,} rollouts each); durations "
          f"lognormal(median {args.median_s:g} s, sigma {args.sigma:g}) cut at {args.cap_s:g} s, mean {mean_dur:.0f} s; "
          f"seed {args.seed}; {sim.sim_seconds / 3600:.1f} simulated hours.")
    print(f"Store: the first {len(sim.finished):,} results, each with a distinct ~2 KB trace (a blob), in "
          f"{store['appends']:,} appends (one worker's poll each; {store['per_append']:.2f} rows per append).")
    print(f"Machine: {os.cpu_count()} cores, 1-minute load average {load_before:.1f} at the start and "
          f"{os.getloadavg()[0]:.1f} at the end. 'CPU' times are the driver thread's own (what it costs with a core "
          f"to itself); 'wall' times include the other processes' share of the cores.\n")
    table = []
    for clock in ("cpu", "wall"):
        (mean, p99), (fmean, fp99) = us[clock], fifo_us[clock]
        table += [
            (f"dispatch time per rollout, mean ({clock.upper() if clock == 'cpu' else clock})", f"{mean:.2f} us",
             f"<= {TARGET_DECISION_US:g} us", f"FIFO deque pop {fmean:.2f} us", f"{mean / fmean:.1f}x its time"),
            (f"dispatch time per rollout, p99 ({clock.upper() if clock == 'cpu' else clock})", f"{p99:.2f} us",
             f"<= {TARGET_DECISION_US:g} us", f"FIFO deque pop {fp99:.2f} us", f"{p99 / fp99:.1f}x its time"),
        ]
    table += [
        ("dispatch decisions per CPU second", f"{1e6 / mean_us:,.0f} /s", "", f"FIFO {1e6 / fifo_mean_us:,.0f} /s",
         f"{fifo_mean_us / mean_us:.2f}x its rate"),
        ("worst group's wait / fair share", f"{worst:.3f} ({worst_group})", f"<= {TARGET_FAIR_RATIO:g}",
         f"FIFO {fifo_worst:,.1f} ({fifo_worst_group})", ""),
        ("store write rate, rows+blobs+hash list (wall)", f"{store['wall']:,.0f} rows/s",
         f">= {TARGET_ROWS_PER_S:,.0f} rows/s", f"pyarrow rows only {store['pyarrow']:,.0f} rows/s",
         f"{store['wall'] / store['pyarrow']:.3f}x its rate"),
        ("store write rate, per CPU second", f"{store['cpu']:,.0f} rows/s", f">= {TARGET_ROWS_PER_S:,.0f} rows/s", "", ""),
        (f"pool's free-slot scan, per pump ({args.nodes:,} workers)", f"{scan['cpu']:.1f} us CPU, {scan['wall']:.1f} wall",
         "", "", f"{pumps_per_rollout:.2f} pumps per rollout"),
        ("driver RSS, peak after dispatch", f"{rss_dispatch:,.0f} MB", "", "", ""),
        ("driver RSS, peak at the end", f"{peak:,.0f} MB", "", "", ""),
        ("scheduler memory per queued rollout", f"{per_job:,.0f} B", "", "",
         f"{per_job * args.rollouts / 2**20:,.0f} MB for {args.rollouts:,} queued"),
        ("cluster demand (all slots busy)", f"{demand:,.1f} rollouts/s", "", "", ""),
        ("driver capacity, dispatch + scan + store (CPU)", f"{driver_cap['cpu']:,.0f} rollouts/s", "", "",
         f"{slots / driver_cap['cpu']:,.1f} s: shortest mean rollout keeping all slots busy"),
        ("driver capacity, dispatch + scan + store (wall)", f"{driver_cap['wall']:,.0f} rollouts/s", "", "", ""),
    ]
    head = ("figure", "value", "target", "baseline (same run)", "vs baseline")
    widths = [max(len(r[i]) for r in table + [head]) for i in range(5)]
    for row in [head, tuple("-" * w for w in widths)] + table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    print("\nWaits are counted in dispatch decisions from a group's arrival to its last rollout's dispatch; the fair "
          "share is that wait with every dispatch split equally among the groups then queued. The dispatch time "
          "covers done() + pick() + runnable() per pump; the pool's scan is timed apart. The driver's capacity is "
          "1 / (dispatch + scan per rollout + store time per row). RSS includes the queued RolloutRequest objects, "
          "not the scheduler's per-rollout job and future."
          + (" With --profile, the dispatch and store times include cProfile's overhead." if args.profile else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)
    return figures


if __name__ == "__main__":
    main(sys.argv[1:])
