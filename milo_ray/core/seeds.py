"""One seed derivation for every method, and what is (and is not) reproducible.

Every random choice (MILO's and SSR's alike) draws from a ``numpy.random.Generator`` seeded by
:func:`derive_seed` (run seed, purpose, island, round, ...), never from global state:

* initialization: the B_search/B_val subsets and the initial island -> mutator
  assignment use ``derive_seed(seed, "init", ...)``;
* parent selection of island j in round r: ``derive_seed(seed, "parent", j, r)``;
* the mutation of island j in round r: ``derive_seed(seed, "mutate", j, r)``;
* orchestrator decisions: ``derive_seed(seed, "orchestrate", j, r)``;
* rollouts carry the run seed; the executor derives each rollout's stream from
  (seed, harness_id, task_id, rollout_idx), so a rollout's result never depends on
  when or where it ran, and the scheduler's cache makes re-runs free;
* the final test's rollouts carry :func:`final_test_seed` instead: their cache keys are
  never a search rollout's, so the draws that chose a harness are never reused as its
  test result (the winner's curse), and a resumed run's final test still hits its cache.

Reproducible: with ``round_sync=True`` (MILO's default: Algorithm 1's rounds) a run
is a deterministic function of its config and seed (islands advance in lock-step;
orchestrator triggers are handled in island order between rounds), and a resumed run
reaches the same lineage, assignment and stall counters as an uninterrupted one. With
free-running islands (``round_sync=False``, an option for uneven mutation times) each
island's own sequence of parents, mutations and verdicts is reproducible *given the same order of completions*; what is not reproducible is the
cross-island interleaving: which island's stall reaches the orchestrator first, what
the other islands hold at that moment, and therefore the decisions and everything
downstream of them. Mutators and orchestrators backed by LLMs add their own
nondeterminism.
"""

from __future__ import annotations

import hashlib
import json


def derive_seed(run_seed: int, *parts: object) -> int:
    """A 63-bit seed for one purpose, stable across processes and Python versions."""
    raw = json.dumps([int(run_seed), *[str(p) for p in parts]])
    return int.from_bytes(hashlib.sha256(raw.encode()).digest()[:8], "big") >> 1


def final_test_seed(run_seed: int) -> int:
    """The rollout seed of a run's final test: a namespace of its own, disjoint from the
    run seed every search rollout carries (see the module docstring)."""
    return derive_seed(run_seed, "final-test")
