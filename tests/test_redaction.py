"""Redaction of registered secret values: every form a persisted text may hold them in is
replaced, short values are left alone, and a logging handler with the filter never writes one."""

from __future__ import annotations

import json
import logging

import pytest

from milo_ray import redaction

KEY = "sk-canary-redaction-0123456789"


@pytest.fixture(autouse=True)
def _clean():
    redaction.clear()
    yield
    redaction.clear()


def test_values_are_replaced_everywhere_in_nested_data_and_short_ones_are_kept():
    redaction.register({"K": KEY, "SHORT": "abc1234"})  # 7 chars: below MIN_SECRET_CHARS
    assert redaction.registered_names() == ["K"]
    data = {"a": [f"x{KEY}y", (KEY,)], KEY: b"raw " + KEY.encode(), "n": 3, "s": "abc1234"}
    got = redaction.redact_obj(data)
    assert KEY not in repr(got) and got["n"] == 3 and got["s"] == "abc1234"
    assert got["a"][0] == "x[redacted $K]y" and got["[redacted $K]"] == b"raw [redacted $K]"
    assert data["a"][0] == f"x{KEY}y"  # the input is not mutated


def test_json_escaped_values_are_replaced_and_nothing_registered_is_a_no_op():
    obj = {"k": 'sk-"quoted\\secret-0123'}
    assert redaction.redact_obj(obj) is obj
    redaction.register({"Q": obj["k"]})
    assert obj["k"] not in redaction.redact(json.dumps(obj)) and json.dumps(obj["k"])[1:-1] not in \
        redaction.redact(json.dumps(obj))


def test_a_handler_with_the_filter_never_writes_a_secret(tmp_path):
    redaction.register_env(["MY_KEY"], {"MY_KEY": KEY})
    handler = redaction.install_log_redaction(logging.FileHandler(tmp_path / "run.log"))
    redaction.install_log_redaction(handler)
    assert len(handler.filters) == 1
    log = logging.getLogger("milo_ray.test_redaction")
    log.addHandler(handler)
    try:
        log.warning("calling with %s", KEY)
        try:
            raise RuntimeError(f"provider said: bad key {KEY}")
        except RuntimeError:
            log.exception("the call failed")
    finally:
        log.removeHandler(handler)
        handler.close()
    text = (tmp_path / "run.log").read_text()
    assert KEY not in text and text.count("[redacted $MY_KEY]") == 2  # the message and the exception line


def test_scrub_tree_redacts_files_written_directly_and_leaves_store_files_alone(tmp_path):
    (tmp_path / "workspace" / "h").mkdir(parents=True)
    leaky = tmp_path / "workspace" / "h" / "harness.py"
    leaky.write_text(f"KEY = {KEY!r}\n")
    leaky.chmod(0o640)
    clean = tmp_path / "workspace" / "notes.md"
    clean.write_text("nothing here\n")
    table = tmp_path / "rollouts" / "part-0.parquet"
    table.parent.mkdir()
    table.write_bytes(KEY.encode())  # store-owned: redacted when written, never rewritten here
    assert redaction.scrub_tree(tmp_path) == []  # nothing registered: nothing touched
    redaction.register({"K": KEY})
    assert redaction.scrub_tree(tmp_path) == ["workspace/h/harness.py"]
    assert leaky.read_text() == "KEY = '[redacted $K]'\n" and (leaky.stat().st_mode & 0o777) == 0o640
    assert clean.read_text() == "nothing here\n" and table.read_bytes() == KEY.encode()
    assert sorted(p.name for p in (tmp_path / "workspace" / "h").iterdir()) == ["harness.py"]
