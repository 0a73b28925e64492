"""The dispatch rules without Ray: FIFO within a group, round-robin across groups, group
caps (also when they change with items in flight), most-free-node placement."""

from __future__ import annotations

import itertools
import subprocess
import sys
from collections import Counter

import pytest

from milo_ray.execution.dispatch import Dispatch


def _run_one_slot_at_a_time(d: Dispatch, picks: int) -> list[str]:
    """Hand out one slot per pick, the picked item finishing before the next pick (how
    a busy cluster frees slots); returns the items in dispatch order."""
    order = []
    for _ in range(picks):
        (node, (group, item)), = d.pick({"n": 1})
        order.append(item)
        d.done(group)
    return order


def _filled(d: Dispatch, groups: dict[str, int]) -> Dispatch:
    for group, n in groups.items():
        for i in range(n):
            d.submit(group, (group, f"{group}{i}"))
    return d


def test_a_group_with_a_long_queue_cannot_starve_a_group_with_a_short_one():
    d = _filled(Dispatch(), {"big": 100, "small": 2})
    order = _run_one_slot_at_a_time(d, 4)
    assert order == ["big0", "small0", "big1", "small1"]


def test_groups_take_turns_within_one_pick():
    d = _filled(Dispatch(), {"a": 5, "b": 5, "c": 1})
    picked = [item for _, (_, item) in d.pick({"n": 6})]
    assert picked == ["a0", "b0", "c0", "a1", "b1", "a2"]


def test_a_group_that_was_served_waits_for_the_others_across_picks():
    d = _filled(Dispatch(), {"a": 3, "b": 3, "c": 3})
    first = [item for _, (_, item) in d.pick({"n": 2})]
    second = [item for _, (_, item) in d.pick({"n": 2})]
    assert first == ["a0", "b0"] and second == ["c0", "a1"]


def test_items_leave_their_group_in_submission_order_and_a_retry_goes_first():
    d = _filled(Dispatch(), {"g": 6})
    assert [item for _, (_, item) in d.pick({"n": 3})] == ["g0", "g1", "g2"]
    d.requeue("g", ("g", "g1"))  # its attempt failed: it is due before the rest
    assert [item for _, (_, item) in d.pick({"n": 10})] == ["g1", "g3", "g4", "g5"]


@pytest.mark.parametrize("limit", [1, 2, 3])
def test_a_group_never_has_more_in_flight_than_its_limit(limit):
    d = _filled(Dispatch(limits={"capped": limit}), {"capped": 10, "free": 20})
    picks = d.pick({"n1": 4, "n2": 4})
    per_group = Counter(group for _, (group, _) in picks)
    assert per_group == {"capped": limit, "free": 8 - limit}
    assert d.in_flight("capped") == limit
    d.done("capped")
    assert [group for _, (group, _) in d.pick({"n1": 5})] == ["capped", "free", "free", "free", "free"]


def test_the_default_limit_caps_groups_without_their_own_and_none_means_unbounded():
    d = _filled(Dispatch(default_limit=2, limits={"wide": 5}), {"a": 9, "wide": 9})
    assert Counter(group for _, (group, _) in d.pick({"n": 20})) == {"a": 2, "wide": 5}
    d = _filled(Dispatch(), {"a": 9})
    assert len(d.pick({"n": 20})) == 9


def test_a_lowered_limit_is_never_exceeded_while_the_items_above_it_finish():
    d = _filled(Dispatch(limits={"g": 4}), {"g": 20})
    assert len(d.pick({"n": 8})) == 4
    d.set_limit("g", 2)  # four in flight: none may start until fewer than two are
    for in_flight in (3, 2):
        d.done("g")
        assert d.pick({"n": 8}) == [] and d.in_flight("g") == in_flight
    d.done("g")
    assert len(d.pick({"n": 8})) == 1 and d.in_flight("g") == 2


def test_a_raised_limit_and_a_limit_back_to_default_apply_to_the_next_pick():
    d = _filled(Dispatch(default_limit=3, limits={"g": 1}), {"g": 20})
    assert len(d.pick({"n": 8})) == 1
    d.set_limit("g", 2)
    assert len(d.pick({"n": 8})) == 1 and d.in_flight("g") == 2
    d.set_limit("g", None)  # back to the default of 3
    assert len(d.pick({"n": 8})) == 1 and d.in_flight("g") == 3
    assert dict(d.limits) == {}


def test_items_go_to_the_node_with_the_most_free_slots():
    d = _filled(Dispatch(), {"g": 6})
    nodes = [node for node, _ in d.pick({"small": 1, "big": 4, "mid": 2})]
    # big takes items until it ties mid at 2, and wins that tie (the smaller id); then
    # mid, and at one free slot each the three tie again.
    assert nodes == ["big", "big", "big", "mid", "big", "mid"]
    assert Counter(nodes) == {"big": 4, "mid": 2}


def test_ties_between_nodes_do_not_depend_on_the_order_they_are_listed_in():
    free = {"node-b": 2, "node-a": 2, "node-c": 2}
    placements = set()
    for order in itertools.permutations(free):
        d = _filled(Dispatch(), {"g": 4})
        placements.add(tuple(node for node, _ in d.pick({n: free[n] for n in order})))
    assert placements == {("node-a", "node-b", "node-c", "node-a")}


def test_nothing_is_dispatched_without_free_slots():
    d = _filled(Dispatch(), {"a": 3, "b": 3})
    assert d.pick({}) == [] and d.pick({"n1": 0, "n2": 0}) == []
    assert d.queued() == 6 and d.in_flight("a") == d.in_flight("b") == 0


def test_more_slots_than_work_takes_everything_once():
    d = _filled(Dispatch(), {"a": 2, "b": 1})
    assert len(d.pick({"n": 100})) == 3 and d.queued() == 0 and d.pick({"n": 100}) == []


def test_clear_empties_the_queues_and_keeps_the_in_flight_counts():
    d = _filled(Dispatch(), {"a": 3, "b": 2})
    d.pick({"n": 2})
    assert sorted(item for _, item in d.clear()) == ["a1", "a2", "b1"]
    assert d.queued() == 0 and d.in_flight_by_group() == {"a": 1, "b": 1}


def test_done_without_an_item_in_flight_is_an_error():
    d = _filled(Dispatch(), {"a": 1})
    with pytest.raises(RuntimeError, match="'a'"):
        d.done("a")


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_a_bad_limit_is_a_value_error_naming_it(bad):
    with pytest.raises(ValueError, match="limit of group 'g'"):
        Dispatch().set_limit("g", bad)
    with pytest.raises(ValueError, match=r"group_limits\['g'\]"):
        Dispatch(limits={"g": bad})
    with pytest.raises(ValueError, match="default_group_limit"):
        Dispatch(default_limit=bad)


def test_the_limits_view_is_read_only_and_names_the_setter():
    d = Dispatch(limits={"g": 2})
    with pytest.raises(TypeError, match=r"set_group_limit\('g', 3\)"):
        d.limits["g"] = 3
    assert d.limits["g"] == 2


def test_the_dispatch_rules_import_without_ray():
    code = "import sys; sys.modules['ray'] = None; import milo_ray.execution.dispatch"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
