"""Every field of every typed config group, given a mistyped or an out-of-range value, is
refused in one line naming the field, before anything is built or written.

The cases are generated from the schemas themselves (run, execution, model and each
method's schema), so a field added later is covered without an edit here; a field
where a negative number is meaningful is listed in ``NEGATIVE_OK`` with the reason.
The command-line path (exit 2, nothing written) is exercised for a sample in
test_entry_config.py; here the same checks run in-process, which is what makes
covering every field affordable.
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest

from milo_ray.config.errors import UserError
from milo_ray.config.paths import conf_dir
from milo_ray.config.schemas import EvalConfig, ExecutionConfig, ModelConfig, RunConfig, register_configs
from milo_ray.config.validate import check_overrides
from milo_ray.milo.config import MiloConfig
from milo_ray.ssr.config import SSRConfig

CONF = conf_dir()
register_configs()

# Fields where any number, negative included, is a valid value.
NEGATIVE_OK = {
    "run.seed": "any integer seeds a run",
    "method.seed": "any integer seeds a method",
    "benchmark.seed": "any integer generates a surrogate task pool",
    "benchmark.split_seed": "any integer shuffles the task ids",
}
# Fields not reachable by a plain override value (specs, mappings) or owned by a group
# other than the schema's (the method's _target_ picks the method).
SKIP = {"method._target_"}

METHODS = {"milo": MiloConfig, "ssr": SSRConfig, "eval": EvalConfig}
SECTIONS = {"run": RunConfig, "execution": ExecutionConfig, "model": ModelConfig}


def _leaves(schema: type, prefix: str):
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        key = f"{prefix}.{f.name}"
        kind = hints[f.name]
        if f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(f.default_factory()):
            yield from _leaves(type(f.default_factory()), key)
            continue
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        base = args[0] if typing.get_origin(kind) is typing.Union and len(args) == 1 else kind
        if base in (int, float, bool) and key not in SKIP:
            yield key, base


# Groups built from a ``_target_`` spec: the numeric keys of each option file are the fields.
SPEC_GROUPS = ("benchmark", "executor", "sandbox")
# An executor option that needs a benchmark of its kind to be composed at all.
_EXECUTOR_BENCHMARK = {"deepagents": "harbor", "optimizer": "einstein", "surrogate": "surrogate_tb21"}
# Real agents need a model; the tasks' reference solutions run without one (offline).
_OFFLINE_AGENT = "executor.agent=oracle"
_AGENT_BENCHMARKS = ("harbor", "swe", "einstein_agent", "paperbench", "are")


def _swe_rows() -> str:
    """A one-row SWE JSONL file (the swe benchmark needs a path before it checks values)."""
    import json
    import tempfile

    row = {"instance_id": "o__r-1", "repo": "o/r", "base_commit": "abc", "problem_statement": "fix it",
           "FAIL_TO_PASS": ["t.py::test_a"], "PASS_TO_PASS": [], "image_name": "img/o__r-1:1"}
    path = Path(tempfile.mkdtemp(prefix="swe-rows-")) / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n")
    return str(path)


def _spec_cases():
    import yaml

    for group in SPEC_GROUPS:
        for path in sorted((Path(CONF) / group).glob("*.yaml")):
            node = yaml.safe_load(path.read_text()) or {}
            pre = [f"{group}={path.stem}"]
            if group == "executor":
                pre = [f"benchmark={_EXECUTOR_BENCHMARK[path.stem]}", *pre]
            elif group == "sandbox":
                pre = ["benchmark=harbor", *pre]
            if "benchmark=harbor" in pre or path.stem in _AGENT_BENCHMARKS or path.stem == "deepagents":
                pre.append(_OFFLINE_AGENT)
            if group == "benchmark" and path.stem == "swe":
                pre.append(f"benchmark.path={_swe_rows()}")
            if group == "benchmark" and path.stem == "paperbench":
                pre.append(f"benchmark.path={Path(__file__).parents[1] / 'fixtures' / 'paperbench' / 'papers'}")
            if group == "benchmark" and path.stem == "are":
                pre.append(f"benchmark.path={Path(__file__).parents[1] / 'fixtures' / 'are'}")
            for key, value in node.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    yield pre, f"{group}.{key}", type(value)


def _cases():
    yield from _spec_cases()
    for section, schema in SECTIONS.items():
        for key, base in _leaves(schema, section):
            yield [], key, base
    for method, schema in METHODS.items():
        for key, base in _leaves(schema, "method"):
            yield [f"method={method}"], key, base


CASES = [(pre, key, base, bad) for pre, key, base in _cases()
         for bad in (["mistyped"] + ([] if base is bool or key in NEGATIVE_OK else ["negative"]))]


def _refusal(argv: list[str]) -> str | None:
    """The message a run given ``argv`` is refused with before it writes anything, or None."""
    from milo_ray.run import _build

    try:
        cfg = check_overrides(CONF, argv)
    except UserError as exc:
        return str(exc)
    try:
        for section in ("benchmark", "executor", "method"):
            _build(section, cfg[section])  # each constructor's own value checks
    except UserError as exc:
        return str(exc)
    return None


@pytest.mark.slow  # ~150 compositions
@pytest.mark.parametrize("pre,key,base,bad", CASES, ids=[f"{c[1]}-{c[3]}" for c in CASES])
def test_every_typed_field_refuses_a_bad_value_in_one_line_naming_it(pre, key, base, bad):
    value = "not_a_value" if bad == "mistyped" else ("-1" if base is int else "-0.5")
    if base is float and bad == "mistyped":
        value = "abc"
    message = _refusal([*pre, f"{key}={value}"])
    assert message is not None, f"{key}={value} was accepted"
    first = message.splitlines()[0]
    short = key.split(".", 1)[1]
    assert key in first or (key.startswith("method.") and f"method.{short}" in first), message
    assert len(message.splitlines()) == 1, message


def test_several_problems_are_all_listed_at_once():
    message = _refusal(["run.time_limit_s=-1", "execution.max_retries=-1", "model.temperature=9"]) or ""
    lines = message.splitlines()
    assert [line.split("=")[0] for line in lines] == ["run.time_limit_s", "model.temperature",
                                                       "execution.max_retries"], message
