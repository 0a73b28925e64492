"""Run directories written before the shared event log still open, and read the same.

``tests/fixtures/runs_before_eventlog`` holds a small MILO and a small SSR run written
by the code of before the change, and ``expected.json`` what that code read from them
(``capture.py`` there says how). Every stored payload must decode and re-encode to the
text it was stored as; MILO's projected state, SSR's recorded decisions, the live
status lines and the results API's final test and comparison row must equal what the
old code produced (``capture.py`` run on the current code writes the same file).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from milo_ray.milo.events import MILO_EVENTS
from milo_ray.milo.state import MiloState
from milo_ray.search.events import EventLog, canonical_payload
from milo_ray.ssr.events import SSR_EVENTS
from milo_ray.ssr.state import RecordedRun
from milo_ray.store.parquet import open_run
from milo_ray.tracking.status import RunStatus

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "runs_before_eventlog"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())
TYPES = {"milo": MILO_EVENTS, "ssr": SSR_EVENTS}


def _canonical(v):
    return json.loads(json.dumps(v, sort_keys=True, default=str))


def _types_of(kind: str):
    return TYPES[kind.split(".", 1)[0]]


@pytest.mark.parametrize("i", range(len(EXPECTED["golden"])))
def test_every_event_class_keeps_its_stored_format(i):
    row = EXPECTED["golden"][i]
    types = _types_of(row["kind"])
    event = types.decode(row["kind"], row["payload"], **row["columns"])
    assert types.kind_of(event) == row["kind"]
    assert canonical_payload(event.to_payload()) == canonical_payload(row["payload"])
    assert _canonical(event.columns()) == row["columns"]


def test_the_golden_rows_cover_every_registered_kind():
    # ssr.summary was not an SSR event class before: the stored SSR run holds one.
    stored = {r["kind"] for r in EXPECTED["golden"]} | {"ssr.summary"}
    assert set(MILO_EVENTS) | set(SSR_EVENTS) <= stored
    assert "ssr.summary" in EXPECTED["ssr"]["kinds"]


@pytest.mark.parametrize("method", ["milo", "ssr"])
def test_every_stored_row_decodes_and_reencodes_to_its_stored_text(method):
    types = TYPES[method]
    rows = [r for r in open_run(FIXTURES / method).read("events").to_pylist() if types.owns(r["kind"])]
    assert {r["kind"] for r in rows} == {k for k in EXPECTED[method]["kinds"] if types.owns(k)}
    for r in rows:
        event = types.decode_row(r)
        assert types.kind_of(event) == r["kind"]
        assert canonical_payload(event.to_payload()) == r["payload"], r["kind"]
        stored_cols = {c: r[c] for c in event.column_fields if r.get(c) is not None}
        assert event.columns() == stored_cols


def test_milo_state_replays_to_what_the_old_code_projected():
    state = MiloState()
    events = EventLog(open_run(FIXTURES / "milo"), MILO_EVENTS).replay(state.apply)
    assert len(events) == state.events_applied > 0
    snap = state.snapshot()
    snap["speciations"] = {f"{k[0]}/{k[1]}": v for k, v in snap["speciations"].items()}
    assert _canonical(snap) == EXPECTED["milo"]["state"]


def test_ssr_recorded_decisions_equal_what_the_old_code_recorded():
    run = RecordedRun.from_store(open_run(FIXTURES / "ssr"))

    def ev(e):
        return None if e is None else {"type": type(e).__name__, "payload": e.to_payload(), "columns": e.columns()}

    got = {str(rnd): {
        "started": ev(rec.started), "judged": {t: ev(j) for t, j in sorted(rec.judged.items())},
        "refresh": ev(rec.refresh), "draws": {f"{i}/{d}": ev(e) for (i, d), e in sorted(rec.draws.items())},
        "candidates": ev(rec.candidates), "stages": {str(s): ev(e) for s, e in sorted(rec.stages.items())},
        "results": {str(s): ev(e) for s, e in sorted(rec.results.items())}, "selection": ev(rec.selection),
    } for rnd, rec in sorted(run.rounds.items())}
    assert _canonical({"rounds": got, "role_budget": ev(run.role_budget)}) == EXPECTED["ssr"]["recorded"]


@pytest.mark.parametrize("method", ["milo", "ssr"])
def test_status_lines_equal_the_old_codes(method):
    status = RunStatus()
    status.replay(open_run(FIXTURES / method))
    assert status.lines() == EXPECTED[method]["status_lines"]


@pytest.mark.parametrize("method", ["milo", "ssr"])
def test_the_results_final_test_equals_the_old_codes(method):
    from milo_ray import results

    frame = results.final_test(results.load_run(FIXTURES / method))
    assert _canonical(frame.to_dict("records")) == EXPECTED[method]["final_test"]


@pytest.mark.parametrize("method", ["milo", "ssr"])
def test_the_results_comparison_row_equals_the_old_codes(method):
    from milo_ray import results

    rows = results.compare([FIXTURES / method]).to_dict("records")
    # Every column the old code had reads the same; columns added since (the held-out
    # figures) come on top.
    old_columns = set(EXPECTED[method]["compare"][0])
    assert set(results.HELD_OUT_COLUMNS) <= set(rows[0]) - old_columns
    assert _canonical([{k: v for k, v in r.items() if k in old_columns} for r in rows]) == EXPECTED[method]["compare"]
