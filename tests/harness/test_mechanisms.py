"""Mechanism catalog, AST detection and code transformations."""

from __future__ import annotations

import ast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from milo_ray.harness.mechanisms import (
    FAILURE_MODES,
    MECHANISMS,
    add_mechanism,
    detect_mechanisms,
    remove_mechanism,
    set_param,
)
from milo_ray.harness.seeds import load_seeds

SEEDS = {h.name: h.source for h in load_seeds()}


def test_catalog_has_at_least_twelve_mechanisms_each_addressing_known_modes():
    assert len(MECHANISMS) >= 12
    for spec in MECHANISMS.values():
        assert spec.addresses and set(spec.addresses) <= set(FAILURE_MODES)
    covered = {m for s in MECHANISMS.values() for m in s.addresses}
    assert covered == set(FAILURE_MODES)


def test_every_template_is_real_code_that_compiles():
    for spec in MECHANISMS.values():
        if spec.template:
            ast.parse(spec.template)


@settings(max_examples=25, deadline=None)
@given(seed=st.sampled_from(sorted(SEEDS)),
       ops=st.lists(st.tuples(st.booleans(), st.sampled_from(sorted(MECHANISMS))), min_size=1, max_size=12))
def test_random_add_remove_sequences_keep_source_compilable_and_detected(seed, ops):
    src = SEEDS[seed]
    for add, name in ops:
        if add:
            src = add_mechanism(src, name)
            assert name in detect_mechanisms(src)
        else:
            src = remove_mechanism(src, name)
            assert name not in detect_mechanisms(src)
        compile(src, "harness.py", "exec")


def test_set_param_writes_a_literal_that_detection_reads_back():
    src = add_mechanism(SEEDS["stock"], "deadline_governor", final_frac=0.7)
    assert detect_mechanisms(src)["deadline_governor"]["final_frac"] == 0.7
    src = set_param(src, "deadline_governor", "warn_frac", 0.4)
    got = detect_mechanisms(src)["deadline_governor"]
    assert got == {"warn_frac": 0.4, "final_frac": 0.7}
    compile(src, "h", "exec")


def test_deleting_the_hook_of_a_middleware_removes_the_mechanism():
    src = SEEDS["plan_and_solve"]
    assert "plan_gate" in detect_mechanisms(src)
    broken = src.replace("def after_model(self, state", "def _after_model_disabled(self, state", 1)
    compile(broken, "h", "exec")
    assert "plan_gate" not in detect_mechanisms(broken)


def test_unwired_definition_does_not_count():
    src = SEEDS["reproduce_first"]
    unwired = src.replace("[DefaultRubricGate(model=model, max_iterations=2)]", "[]")
    assert "DefaultRubricGate" in unwired and "rubric_gate" not in detect_mechanisms(unwired)
    dropped = src.replace("        middleware=middleware,\n", "")
    assert "rubric_gate" not in detect_mechanisms(dropped)


def test_subagents_in_a_bare_loop_bring_the_deepagents_stack():
    src = add_mechanism(SEEDS["minimal"], "verifier_subagent")
    found = detect_mechanisms(src)
    assert {"deepagents_stack", "verifier_subagent"} <= set(found)
    bare = remove_mechanism(src, "deepagents_stack")
    assert detect_mechanisms(bare) == {}
    assert "make_core_tools(backend)" in bare
    compile(bare, "h", "exec")


def test_bad_names_and_values_raise_value_error_naming_the_problem():
    with pytest.raises(ValueError, match="unknown"):
        add_mechanism(SEEDS["stock"], "teleporter")
    with pytest.raises(ValueError, match="max_gates"):
        add_mechanism(SEEDS["stock"], "plan_gate", max_gates=-1)
    with pytest.raises(ValueError, match="not present"):
        set_param(SEEDS["stock"], "plan_gate", "max_gates", 2)
    assert detect_mechanisms("def build_agent(:") == {}


def test_a_parse_raced_by_another_threads_ast_construction_is_retried(monkeypatch):
    # CPython 3.11 keeps the AST constructor's depth count per interpreter: a parse in a
    # thread outside our lock (a library's) can make ours fail once; it is retried.
    import ast as real_ast

    from milo_ray.harness.mechanisms import analysis

    calls = {"n": 0}
    parse = real_ast.parse

    def racy(source, mode="exec"):
        calls["n"] += 1
        if calls["n"] == 1:
            raise SystemError("AST constructor recursion depth mismatch (before=141, after=34)")
        return parse(source, mode=mode)

    monkeypatch.setattr(analysis.ast, "parse", racy)
    tree = analysis.parse_source("x = 1\n")
    assert isinstance(tree, real_ast.Module) and calls["n"] == 2
    monkeypatch.setattr(analysis.ast, "parse", lambda *a, **k: (_ for _ in ()).throw(SystemError("other")))
    try:
        analysis.parse_source("x = 1\n")
    except SystemError as e:
        assert "other" in str(e)
    else:
        raise AssertionError("an unrelated SystemError must propagate")
