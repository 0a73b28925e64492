"""The dispatch rules at scale: the heap-based Dispatch decides exactly as the plain
statement of its rules does, and the 1,000-node simulation (scripts/bench_dispatch_scale.py)
reports every figure and finds round-robin fair where FIFO is not."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections import Counter, deque

import numpy as np
import pytest

from milo_ray.execution.dispatch import Dispatch

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _bench_module():
    """scripts/bench_dispatch_scale.py as a module, run in this process (so it measures
    the package these tests import)."""
    name = "bench_dispatch_scale"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(_ROOT, "scripts", f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # its dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules[name]


class _PlainRules:
    """The dispatch rules as the module docstring states them, with no care for cost:
    the turn order is a list (served groups move to its end, capped ones keep their
    place), each item goes to the worker with the most free slots (ties: smallest key),
    and the counts are recounted on every question."""

    def __init__(self, default_limit=None, limits=None):
        self.default_limit, self.limits = default_limit, dict(limits or {})
        self.queues: dict[str, deque] = {}
        self.in_flight: Counter = Counter()

    def limit(self, group):
        return self.limits.get(group, self.default_limit)

    def set_limit(self, group, limit):
        if limit is None:
            self.limits.pop(group, None)
        else:
            self.limits[group] = limit

    def submit(self, group, item):
        self.queues.setdefault(group, deque()).append(item)

    def requeue(self, group, item):
        self.queues.setdefault(group, deque()).appendleft(item)

    def done(self, group):
        self.in_flight[group] -= 1

    def queued(self):
        return sum(len(q) for q in self.queues.values())

    def runnable(self):
        return sum(len(q) if self.limit(g) is None else max(0, min(len(q), self.limit(g) - self.in_flight[g]))
                   for g, q in self.queues.items())

    def pick(self, free_slots):
        free = {n: k for n, k in free_slots.items() if k > 0}
        picks = []
        while free:
            served = False
            for group in list(self.queues):
                if not free:
                    break
                limit = self.limit(group)
                if limit is not None and self.in_flight[group] >= limit:
                    continue
                queue = self.queues.pop(group)
                item = queue.popleft()
                if queue:
                    self.queues[group] = queue
                self.in_flight[group] += 1
                node = min(free, key=lambda n: (-free[n], n))
                picks.append((node, item))
                free[node] -= 1
                if not free[node]:
                    del free[node]
                served = True
            if not served:
                break
        return picks


@pytest.mark.parametrize("seed", range(12))
def test_the_dispatch_decides_exactly_as_its_plain_rules_do(seed):
    """Random sequences of submits, retries, picks, finishes and limit changes (lowered
    below what is in flight, raised, back to the default): every pick, runnable() and
    queued() agree with the plain statement of the rules."""
    rng = np.random.default_rng(seed)
    groups = [f"g{i}" for i in range(int(rng.integers(2, 7)))]
    default = None if seed % 3 == 0 else int(rng.integers(1, 4))
    limits = {g: int(rng.integers(1, 5)) for g in groups if rng.random() < 0.4}
    fast, plain = Dispatch(default, limits), _PlainRules(default, limits)
    running: list[tuple[str, str]] = []
    serial = 0
    for step in range(400):
        op = rng.random()
        if op < 0.35:
            group = groups[int(rng.integers(len(groups)))]
            for _ in range(int(rng.integers(1, 6))):
                item = (group, f"{group}-{serial}")
                serial += 1
                fast.submit(group, item)
                plain.submit(group, item)
        elif op < 0.45 and running:
            group, item = running.pop(int(rng.integers(len(running))))  # a failed attempt: retried first
            fast.done(group), plain.done(group)
            fast.requeue(group, (group, item))
            plain.requeue(group, (group, item))
        elif op < 0.7 and running:
            for _ in range(int(rng.integers(1, len(running) + 1))):
                group, _item = running.pop(int(rng.integers(len(running))))
                fast.done(group), plain.done(group)
        elif op < 0.8:
            group = groups[int(rng.integers(len(groups)))]
            limit = None if rng.random() < 0.3 else int(rng.integers(1, 5))
            fast.set_limit(group, limit)
            plain.set_limit(group, limit)
        else:
            free = {f"w{j}": int(rng.integers(0, 4)) for j in rng.permutation(int(rng.integers(1, 6)))}
            picked = fast.pick(free)
            assert picked == plain.pick(free), f"step {step}"
            running.extend(item for _node, item in picked)
        assert fast.runnable() == plain.runnable() and fast.queued() == plain.queued(), f"step {step}"
        assert all(fast.in_flight(g) == plain.in_flight[g] for g in groups)


def test_a_group_that_reached_a_lowered_limit_keeps_its_turn_while_it_waits():
    d = Dispatch()
    for group in ("capped", "a", "b", "c"):
        for i in range(3):
            d.submit(group, f"{group}{i}")
    assert [item for _, item in d.pick({"n": 1})] == ["capped0"]
    d.set_limit("capped", 1)  # one in flight: it may start no more
    assert [item for _, item in d.pick({"n": 3})] == ["a0", "b0", "c0"]
    assert [item for _, item in d.pick({"n": 1})] == ["a1"]  # capped's turn came up: it waits
    d.done("capped")
    # Its turn is still before b's and c's, which have not been served since.
    assert [item for _, item in d.pick({"n": 1})] == ["capped1"]
    assert d.runnable() == 0 + 1 + 2 + 2 and d.queued() == 1 + 1 + 2 + 2  # capped: one queued, at its limit


def test_the_scale_bench_reports_every_figure_and_round_robin_stays_within_twice_the_fair_share(tmp_path, capsys):
    out = tmp_path / "figures.json"
    returned = _bench_module().main(["--nodes", "5", "--slots", "4", "--rollouts", "4000", "--groups", "30",
                                     "--store-rows", "200", "--seed", "3", "--json", str(out)])
    stdout, figures = capsys.readouterr().out, json.loads(out.read_text())
    assert figures == json.loads(json.dumps(returned))
    for label in ("dispatch time per rollout, mean (CPU)", "dispatch time per rollout, p99 (CPU)",
                  "dispatch time per rollout, mean (wall)", "dispatch decisions per CPU second",
                  "worst group's wait / fair share", "store write rate, rows+blobs+hash list (wall)",
                  "pool's free-slot scan, per pump (5 workers)", "driver RSS, peak at the end",
                  "driver capacity, dispatch + scan + store (CPU)"):
        assert label in stdout
    s = figures["scenario"]
    assert (s["nodes"], s["slots_per_node"], s["rollouts"], s["groups"]) == (5, 4, 4000, 30)
    assert figures["store_rows"] == 200 and figures["store_appends"] >= 1
    for name in ("decision_us_mean", "decision_us_p99", "fifo_decision_us_mean", "wall_decision_us_mean",
                 "store_rows_per_s", "store_rows_per_cpu_s",
                 "pyarrow_rows_per_s", "pool_scan_us", "scheduler_bytes_per_queued_rollout", "rss_mb_peak", "driver_rollouts_per_s"):
        assert figures[name] > 0, name
    # Round-robin: no group waits past twice its fair share. FIFO, on the same arrivals,
    # makes a late group wait for every rollout queued before it: the figure tells them apart.
    assert figures["worst_fair_share_ratio"] <= 2.0, figures["worst_group"]
    assert figures["fifo_worst_fair_share_ratio"] > 2.0


@pytest.mark.parametrize("args, message", [(["--nodes", "0"], "--nodes must be a positive integer"),
                                           (["--rollouts", "5", "--groups", "9"], "--groups (9) must not exceed")])
def test_the_scale_bench_refuses_a_size_it_cannot_simulate_and_names_the_option(capsys, args, message):
    with pytest.raises(SystemExit):
        _bench_module().main(args)
    assert message in capsys.readouterr().err
