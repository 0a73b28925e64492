"""The report's final-test section says what its figures are: whose rollouts, which split,
how many tasks and rollouts per task, and whether the search ran on those tasks (then the
figure is not held out) -- never "held-out" where it is not."""

from __future__ import annotations

from milo_ray import results
from milo_ray.report import final_test_lead


def test_a_test_split_that_holds_the_search_tasks_is_not_called_held_out(shared_runs):
    # The shared MILO run: surrogate_tb21's test split is the full benchmark, which holds
    # the run's 4 search and 3 validation tasks (tests/shared_runs.py).
    lead = final_test_lead(results.load_run(shared_runs / "milo"))
    assert "on the test split (89 tasks, 1 rollout(s) per task)" in lead, lead
    assert "Every rollout was drawn for the test: none is the search's." in lead, lead
    assert ("7 of these tasks were also run by the search (the papers' full benchmark), so this figure is not held "
            "out; the second table scores the same rollouts on the 82 tasks the search never ran (held out).") in lead


def test_an_eval_run_names_the_evaluated_harnesses_and_claims_nothing_about_a_search(shared_runs):
    lead = final_test_lead(results.load_run(shared_runs / "eval"))
    assert lead.startswith("The evaluated harnesses on the test split") and "held" not in lead, lead
