"""In-process stand-ins for SSR driver tests without Ray: a scheduler that keeps the
real scheduler's contract (cache by key, the store's finished rollouts included, so a
resumed run executes nothing twice) and a small rule-based optimizer."""

from __future__ import annotations

from collections import Counter

import numpy as np
from hydra.utils import instantiate

from milo_ray.agents.protocols import MutationResult
from milo_ray.execution.budget import BudgetLedger
from milo_ray.harness.mechanisms import add_mechanism, detect_mechanisms


class InProcessScheduler:
    """The scheduler's contract in one process: cache by key, reserve the uncached
    part of a request atomically against the ledger, store every result."""

    def __init__(self, bench, store, budget):
        self.executor = instantiate(bench.executor_config(), _convert_="all")
        self.tasks = {t.task_id: t for s in bench.splits().values() for t in s}
        self.store, self.budget, self.model_id = store, budget, "offline"
        self.uncounted = BudgetLedger()  # count_budget=False batches (the final test evaluation)
        self.harnesses, self.results = {}, {}
        self.executed = 0

    def add_harness(self, h):
        self.harnesses[h.harness_id] = h

    def run(self, reqs, *, count_budget=True):
        keys = [r.key(self.model_id) for r in reqs]
        # Rollouts an earlier session stored come back from the store, never run again.
        self.results.update(self.store.get_rollouts([k for k in keys if k not in self.results]))
        new = {k: r for k, r in zip(keys, reqs) if k not in self.results}
        ledger = self.budget if count_budget else self.uncounted
        ledger.reserve(len(new))
        fresh = []
        for k, r in new.items():
            res = self.executor.execute(self.harnesses[r.harness_id], self.tasks[r.task_id], r.rollout_idx, r.seed)
            res.stage, res.round, res.split, res.cache_key, res.method = r.stage, r.round, r.split, k, r.method
            ledger.commit(tokens=res.input_tokens + res.output_tokens, cost_usd=res.cost_usd)
            self.results[k] = res
            fresh.append(res)
            self.executed += 1
        self.store.append_rollouts(fresh)
        return [self.results[k] for k in keys]


class RuleOptimizer:
    """Adds the best-weighted mechanism the records suggest (or, if ``inert``, returns
    the parent unchanged, which never races) — enough to exercise both outcomes."""

    name = "rule-optimizer"

    def __init__(self, inert=False):
        self.inert = inert

    def mutate(self, req):
        rng = np.random.default_rng(req.seed)
        present = detect_mechanisms(req.parent.source)
        if self.inert:
            return MutationResult(req.parent)
        weight = Counter()
        for r in req.context["records"]:
            for m in r["mechanisms"][:1]:
                weight[m] += r["w"] * r["q"]
        choices = [m for m, _ in weight.most_common() if m not in present]
        if not choices:
            return MutationResult(None, error="no new mechanism suggested")
        pick = choices[int(rng.integers(min(2, len(choices))))]
        return MutationResult(req.parent.with_source(add_mechanism(req.parent.source, pick)))
