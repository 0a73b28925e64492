"""Splits of real task sets: disjoint, deterministic by seed, sized as asked, and split
files validated in full."""

from __future__ import annotations

import json

import pytest

from milo_ray.benchmarks.splits import assign_splits, load_split_file, resolve_splits, split_sizes

IDS = [f"task-{i:02d}" for i in range(20)]


def test_splits_are_disjoint_cover_the_fractions_and_ignore_input_order():
    a = assign_splits(IDS, {"search": 0.5, "val": 0.25, "test": 0.25}, seed=7)
    b = assign_splits(list(reversed(IDS)), {"search": 0.5, "val": 0.25, "test": 0.25}, seed=7)
    assert a == b
    assert [len(v) for v in a.values()] == [10, 5, 5]
    flat = [t for v in a.values() for t in v]
    assert len(flat) == len(set(flat)) == 20


def test_the_seed_decides_the_draw():
    draws = {json.dumps(assign_splits(IDS, {"train": 0.5, "test": 0.5}, seed=s)) for s in range(5)}
    assert len(draws) > 1
    assert assign_splits(IDS, {"train": 0.5, "test": 0.5}, seed=3) == assign_splits(IDS, {"train": 0.5, "test": 0.5}, seed=3)


def test_sizes_counts_fractions_and_rounding():
    assert split_sizes(3, {"search": 0.5, "val": 0.25, "test": 0.25}) == {"search": 1, "val": 1, "test": 1}
    assert split_sizes(10, {"a": 0.3, "b": 0.3}) == {"a": 3, "b": 3}  # a subset: 4 tasks unused
    assert split_sizes(10, {"train": 8, "test": 2}) == {"train": 8, "test": 2}
    with pytest.raises(ValueError, match="mixes fractions"):
        split_sizes(10, {"a": 0.5, "b": 5})
    with pytest.raises(ValueError, match="sum to 1.2"):
        split_sizes(10, {"a": 0.6, "b": 0.6})
    with pytest.raises(ValueError, match="asks for 12 tasks"):
        split_sizes(10, {"a": 6, "b": 6})
    with pytest.raises(ValueError, match=r"split\(s\) \['test'\] would get no task"):
        assign_splits(IDS[:2], {"search": 0.5, "val": 0.25, "test": 0.25}, seed=0)


def test_split_file_is_used_as_written_and_unknown_or_repeated_ids_are_refused(tmp_path):
    good = tmp_path / "s.yaml"
    good.write_text("train: [task-01, task-02]\ntest:\n  - task-03\n")
    assert resolve_splits(IDS, sizes={"x": 1.0}, seed=0, split_file=str(good)) == {
        "train": ["task-01", "task-02"], "test": ["task-03"]}
    bad = tmp_path / "s.json"
    bad.write_text(json.dumps({"train": ["task-01", "nope"], "test": ["task-01"], "val": []}))
    with pytest.raises(ValueError) as e:
        load_split_file(bad, IDS)
    msg = str(e.value)
    assert "unknown task id 'nope'" in msg and "task 'task-01' in split 'test' is also in split 'train'" in msg
    assert "split 'val' is empty" in msg and str(bad) in msg
    with pytest.raises(ValueError, match="no such file"):
        load_split_file(tmp_path / "missing.json", IDS)


def test_the_draw_does_not_depend_on_the_order_splits_are_listed_in():
    # A resumed run rebuilds its benchmark from the manifest, whose keys are stored
    # sorted: {search, test, val} must draw what {search, val, test} drew.
    from milo_ray.benchmarks.einstein.benchmark import EinsteinBenchmark

    ids = [f"t{i:02d}" for i in range(20)]
    listed = assign_splits(ids, {"search": 10, "val": 5, "test": 5}, seed=3)
    assert assign_splits(ids, {"test": 5, "search": 10, "val": 5}, seed=3) == listed
    assert assign_splits(ids, {"val": 0.25, "test": 0.25, "search": 0.5}, seed=3) == listed
    starts = [{"base": "alphaevolve", "perturb": 0.001, "seed": s} for s in range(4)]
    a = EinsteinBenchmark(problem="first_autocorrelation", starts=starts, splits={"search": 2, "val": 1, "test": 1})
    b = EinsteinBenchmark(problem="first_autocorrelation", starts=starts, splits={"search": 2, "test": 1, "val": 1})
    assert {k: [t.task_id for t in v] for k, v in a._splits.items()} == \
        {k: [t.task_id for t in v] for k, v in b._splits.items()}
