"""Overhead of ``executor=optimizer`` against running the same optimizer in-process.

    PYTHONPATH=. python scripts/bench_einstein_overhead.py [--n 65536] [--budget 20] [--repeats 2]

The optimizer (``OPTIMIZER`` below) is a random-perturbation ratchet on the first
autocorrelation problem: each iteration perturbs a random block of heights, scores the
candidate by FFT, keeps it and ``publish``es it when it improves -- so it publishes on
every improvement, as the seed programs do. It counts its iterations and prints them.

Per repeat, interleaved so load spikes on a shared machine hit both alike:

* in-process baseline: the program's ``optimize`` called directly with the same start,
  seed and budget (``publish`` a no-op); its wall time and iteration count;
* executor: one rollout of the same program through :class:`OptimizerExecutor` with the
  bwrap sandbox; its wall time (sandbox start, runner, publishing, verification) and
  iteration count.

It prints the wall-time overhead ``(executor wall - baseline wall) / baseline wall`` and
the work lost to publishing and the runner's saving ``1 - iterations(executor) /
iterations(baseline)``, by wall time and per CPU second of the optimizing process (the
sandbox's includes the runner's writer thread; on a loaded machine the wall-time figures
mostly measure the load); the target is < 5 %.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import statistics
import sys
import time
import types

from milo_ray.benchmarks.einstein import start_values
from milo_ray.core.tasks import Task
from milo_ray.execution.optimizer_executor import OptimizerExecutor
from milo_ray.execution.sandbox.bwrap import BwrapSandboxFactory
from milo_ray.harness.model import Harness

OPTIMIZER = '''
import time
import numpy as np


def publish(values):
    """Replaced by the runner."""


def score(h):
    n = h.size
    size = 2 * n - 1
    nfft = 1 << (size - 1).bit_length()
    f = np.fft.rfft(h, nfft)
    return 2 * n * np.fft.irfft(f * f, nfft)[:size].max() / h.sum() ** 2


def optimize(values, *, seed, deadline):
    rng = np.random.default_rng(seed)
    best = values.copy()
    best_s = score(best)
    n, block, iters = best.size, max(1, values.size // 64), 0
    cpu0 = time.process_time()
    while time.monotonic() < deadline:
        i = int(rng.integers(0, n - block))
        cand = best.copy()
        cand[i:i + block] = np.maximum(cand[i:i + block] * (1 + 0.02 * rng.standard_normal(block)), 0.0)
        s = score(cand)
        iters += 1
        if s < best_s:
            best, best_s = cand, s
            publish(best)
    print(f"ITERATIONS {iters} CPU {time.process_time() - cpu0!r} SCORE {best_s!r}")
    return best
'''


def in_process(start, seed: int, budget_s: float) -> tuple[float, tuple[int, float]]:
    module = types.ModuleType("bench_optimizer")
    exec(compile(OPTIMIZER, "harness.py", "exec"), module.__dict__)
    module.PROBLEM = "first_autocorrelation"
    began = time.monotonic()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        module.optimize(start.copy(), seed=seed, deadline=began + budget_s)
    return time.monotonic() - began, iterations(out.getvalue())


def iterations(text: str) -> tuple[int, float]:
    """(iterations, CPU seconds of the process while optimizing) the program printed; the
    CPU time includes the runner's writer thread in the sandbox, so iterations per CPU
    second compares the work done independently of how loaded the machine is."""
    found = re.findall(r"ITERATIONS (\d+) CPU (\S+)", text)
    if not found:
        raise RuntimeError(f"the optimizer printed no iteration count: {text[-500:]!r}")
    return int(found[-1][0]), float(found[-1][1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=65536, help="grid points of the start")
    ap.add_argument("--budget", type=float, default=20.0, help="the optimizer's budget_s")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)
    print("command:", " ".join(["python", *sys.argv]))
    meta = {"format": "einstein", "problem": "first_autocorrelation",
            "start": {"base": "random", "n": args.n, "seed": 0}, "budget_s": args.budget}
    task = Task("bench", "train", "", time_cap_s=args.budget + 2.0, token_cap=0, metadata=meta)
    start = start_values(meta)
    harness = Harness.from_source(OPTIMIZER)
    executor = OptimizerExecutor(sandbox=BwrapSandboxFactory(command_timeout_s=args.budget + 60))
    base_wall, base_iters, base_rate, ex_wall, ex_iters, ex_rate, publishes = [], [], [], [], [], [], []
    for rep in range(args.repeats):
        w, (k, cpu) = in_process(start, rep, args.budget)
        base_wall.append(w)
        base_iters.append(k)
        base_rate.append(k / cpu)
        r = executor.execute(harness, task, 0, rep)
        if r.error:
            raise RuntimeError(f"the rollout failed: {r.error}\n{r.trace.get('stderr_tail')}")
        ex_wall.append(r.latency_s)
        k_ex, cpu_ex = iterations(r.trace["stdout_tail"])
        ex_iters.append(k_ex)
        ex_rate.append(k_ex / cpu_ex)
        publishes.append(r.trace["publishes"])
        print(f"repeat {rep}: in-process {w:.3f} s, {k} iterations | executor {r.latency_s:.3f} s, "
              f"{k_ex} iterations, {publishes[-1]} publishes, {len(r.trace['trajectory'])} saves, "
              f"reward {r.score:.4f}, timed_out={r.timed_out}")
    bw, ew = statistics.median(base_wall), statistics.median(ex_wall)
    bi, ei = statistics.median(base_iters), statistics.median(ex_iters)
    print(f"n={args.n} budget={args.budget:g} s, medians over {args.repeats} repeats:")
    print(f"  wall: in-process {bw:.3f} s, executor {ew:.3f} s -> overhead {100 * (ew - bw) / bw:.2f} %")
    print(f"  iterations: in-process {bi:g}, executor {ei:g} -> work lost {100 * (1 - ei / bi):.2f} % "
          f"(publishes per second {statistics.median(publishes) / args.budget:.1f})")
    br, er = statistics.median(base_rate), statistics.median(ex_rate)
    print(f"  iterations per CPU second: in-process {br:.1f}, executor {er:.1f} -> work lost "
          f"{100 * (1 - er / br):.2f} % (load-independent)")


if __name__ == "__main__":
    main()
