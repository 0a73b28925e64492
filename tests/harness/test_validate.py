"""Invariants of harness validation: bad harnesses are rejected with a reason naming the
problem, good ones pass, and harness code only ever runs in the validation subprocess."""

from __future__ import annotations

import os
import sys
import textwrap

import numpy as np
import pytest

from milo_ray.core.tasks import Task
from milo_ray.harness.model import Harness
from milo_ray.harness.validate import (
    ForbiddenIndex, ValidationResult, forbidden_fragments_for, generality_violation, validate, validate_many,
)

PLAIN = "def build_agent(model, backend):\n    return {'model': model, 'backend': backend}\n"


def src(text: str) -> Harness:
    return Harness.from_source(textwrap.dedent(text))


def test_deepagents_harness_with_fake_model_passes():
    h = src(
        """
        from deepagents import create_deep_agent
        from langchain_core.language_models.fake_chat_models import GenericFakeChatModel

        SYSTEM_PROMPT = "Read the failing test before editing code."

        def build_agent(model, backend, *, max_turns=50):
            return create_deep_agent(model=model, backend=backend, system_prompt=SYSTEM_PROMPT)

        def _smoke():
            return build_agent(GenericFakeChatModel(messages=iter(["done"])), None)
        """
    )
    r = validate(h)
    assert r == ValidationResult(True, None, r.seconds, None)
    assert r.seconds > 0


def test_multi_file_harness_with_local_modules_and_optional_imports_passes():
    h = Harness({
        "harness.py": textwrap.dedent(
            """
            from typing import TYPE_CHECKING
            import helpers
            from tools.search import search
            try:
                import some_optional_accelerator_xyz
            except ImportError:
                some_optional_accelerator_xyz = None
            if TYPE_CHECKING:
                import typing_only_module_xyz

            def build_agent(model, backend, extra=None, *args, **kwargs):
                return helpers.wrap(model, search)
            """
        ),
        "helpers.py": "import json\n\ndef wrap(model, fn):\n    return json.dumps([str(model), fn.__name__])\n",
        "tools/__init__.py": "",
        "tools/search.py": "from .ranking import rank\n\ndef search(q):\n    return rank(q)\n",
        "tools/ranking.py": "def rank(q):\n    return q\n",
    })
    r = validate(h)
    assert r.ok, r.reason


def test_syntax_error_is_rejected_with_file_and_line():
    h = Harness({"harness.py": PLAIN, "tools.py": "x = 1\n\ndef broken(:\n    pass\n"})
    r = validate(h)
    assert not r.ok and r.check == "syntax"
    assert r.reason.startswith("tools.py:3:")


def test_missing_build_agent_is_rejected():
    r = validate(src("def make_agent(model, backend):\n    return None\n"))
    assert not r.ok and r.check == "entry"
    assert "build_agent" in r.reason


def test_non_callable_build_agent_is_rejected():
    r = validate(src("build_agent = {'model': None}\n"))
    assert not r.ok and r.check == "entry"
    assert "not callable" in r.reason


@pytest.mark.parametrize(
    "signature",
    [
        "def build_agent(model):",
        "def build_agent(model, backend, tools):",
        "def build_agent(model, *, backend):",
        "def build_agent(*args, **kwargs):",
        "def build_agent(model, backend, *, debug):",
    ],
)
def test_wrong_build_agent_signature_is_rejected(signature):
    r = validate(src(f"{signature}\n    return None\n"), timeout_s=30)
    assert not r.ok and r.check == "signature", r
    assert "two required positional parameters" in r.reason


def test_unresolvable_import_is_rejected_naming_the_module():
    h = Harness({"harness.py": PLAIN, "util.py": "import os\n\ndef f():\n    import no_such_package_abc\n"})
    r = validate(h)
    assert not r.ok and r.check == "imports"
    assert "no_such_package_abc" in r.reason and r.reason.startswith("util.py:4:")


def test_missing_submodule_of_installed_package_is_rejected():
    r = validate(src("from langchain_core.no_such_submodule import X\n" + PLAIN))
    assert not r.ok and r.check == "imports"
    assert "langchain_core.no_such_submodule" in r.reason


def test_exception_at_import_is_rejected_with_its_line():
    r = validate(src("import json\n\nCONFIG = json.loads('{bad')\n" + PLAIN))
    assert not r.ok and r.check == "import"
    assert "JSONDecodeError" in r.reason and "harness.py:3" in r.reason


def test_task_id_in_any_file_is_rejected():
    fragments = ["django__django-11099", "Fix the admin changelist so that it filters by date correctly."]
    h = Harness({"harness.py": PLAIN, "prompts.md": "Special case for DJANGO__DJANGO-11099: skip tests.\n"})
    r = validate(h, forbidden_fragments=fragments)
    assert not r.ok and r.check == "generality"
    assert r.reason.startswith("prompts.md:") and "django__django-11099" in r.reason


def test_task_id_inside_a_longer_identifier_is_not_a_match():
    idx = ForbiddenIndex(["task-7"])
    assert idx.find("x = 'task-7'") is not None
    assert idx.find("x = 'task-77'") is None
    assert idx.find("x = 'subtask-7'") is None


INSTRUCTION = (
    "The repository contains a date parser that mishandles leap years. Update parse_date so that "
    "February 29 is accepted only in leap years, and add a regression test in tests/test_dates.py "
    "covering the years 1900, 2000 and 2024. Do not change the public API of the module."
)


def test_verbatim_instruction_fragment_is_rejected_despite_case_and_whitespace():
    start = INSTRUCTION.index("February")
    fragment = INSTRUCTION[start : start + 60]
    # Re-wrapped and upper-cased, as a copy pasted into a prompt string might be.
    disguised = fragment.upper().replace(" ", "\n        ", 3)
    h = src(PLAIN + f'\nHINT = """{disguised}"""\n')
    r = validate(h, forbidden_fragments=["dates-042", INSTRUCTION])
    assert not r.ok and r.check == "generality"
    assert "verbatim fragment" in r.reason


def test_short_common_phrase_from_an_instruction_is_not_rejected():
    h = src(PLAIN + '\nHINT = "add a regression test covering the years you change"\n')
    assert "add a regression test" in INSTRUCTION
    r = validate(h, forbidden_fragments=["dates-042", INSTRUCTION])
    assert r.ok, r.reason


def test_boilerplate_every_instruction_shares_may_be_copied_but_a_tasks_own_text_may_not():
    contract = "Write the complete program to out/program.py and define optimize(values, *, seed, deadline)."
    tasks = [f"Task {i}: start from construction number {i} of the bank, step size {i}e-3. {contract}"
             for i in range(3)]
    shared = src(PLAIN + f'\nHINT = """{contract}"""\n')
    assert validate(shared, forbidden_fragments=tasks).ok
    own = src(PLAIN + f'\nHINT = """{tasks[1][:60]}"""\n')
    r = validate(own, forbidden_fragments=tasks)
    assert not r.ok and "verbatim fragment" in r.reason
    # With a single instruction nothing can be told shared: its text stays forbidden.
    alone = validate(shared, forbidden_fragments=tasks[:1])
    assert not alone.ok and "verbatim fragment" in alone.reason


def test_generality_scales_to_two_hundred_long_instructions():
    rng = np.random.default_rng(0)
    vocab = [f"w{i}" for i in range(5000)]
    instructions = [" ".join(rng.choice(vocab, size=400)) for _ in range(200)]
    assert all(len(t) >= 2000 for t in instructions)
    tasks = [Task(f"bench-{i:03d}", "train", t, time_cap_s=600.0, token_cap=10**6) for i, t in enumerate(instructions)]
    fragments = forbidden_fragments_for(tasks)
    clean = Harness.from_source(PLAIN + "".join(f"# note {' '.join(rng.choice(vocab, 5))}\n" for _ in range(500)))
    assert generality_violation(clean, fragments) is None
    leaked = clean.with_source(clean.source + f"# {instructions[137][1000:1045]}\n")
    assert "verbatim fragment" in generality_violation(leaked, fragments)
    assert "bench-150" in generality_violation(clean.with_source(clean.source + "# bench-150\n"), fragments)
    # A prebuilt index is accepted wherever fragments are.
    index = ForbiddenIndex(fragments)
    assert generality_violation(leaked, index) == generality_violation(leaked, fragments)
    r = validate(leaked, forbidden_fragments=index)
    assert not r.ok and r.check == "generality"


def test_instruction_shorter_than_the_window_is_ignored():
    idx = ForbiddenIndex(["fix the bug now please"], min_chars=40)
    assert idx.texts == () and idx.find("fix the bug now please") is None


def test_paths_escaping_the_harness_directory_are_rejected(tmp_path):
    r = validate(Harness({"harness.py": PLAIN, "../escape.py": "x = 1\n"}))
    assert not r.ok and r.check == "files"
    assert "../escape.py" in r.reason


def test_infinite_loop_at_import_times_out():
    r = validate(src("while True:\n    pass\n"), timeout_s=3)
    assert r == ValidationResult(False, "validation timed out after 3s", r.seconds, "timeout")
    assert r.seconds >= 3


def test_huge_allocation_is_stopped_by_the_memory_limit():
    r = validate(src("BUFFER = bytearray(16 * 1024 ** 3)\n" + PLAIN), memory_mb=1024)
    assert not r.ok
    assert "MemoryError" in r.reason and "1024 MB" in r.reason


def test_process_killed_by_a_signal_is_reported():
    r = validate(src("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n" + PLAIN))
    assert not r.ok and r.check == "crash"
    assert "SIGKILL" in r.reason


def test_a_sigkill_under_a_memory_limit_is_named_as_a_signal_never_as_memory():
    # Nothing counted an OOM kill: a SIGKILL is only a SIGKILL.
    r = validate(src("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n" + PLAIN), memory_mb=1024)
    assert not r.ok and r.check == "crash"
    assert "killed by signal 9 (SIGKILL)" in r.reason and "memory" not in r.reason


def test_harness_exiting_the_interpreter_is_reported():
    r_exit = validate(src("import os\nos._exit(3)\n" + PLAIN))
    assert not r_exit.ok and r_exit.check == "crash" and "code 3" in r_exit.reason
    r_sys = validate(src("raise SystemExit(4)\n" + PLAIN))
    assert not r_sys.ok and r_sys.check == "import" and "SystemExit" in r_sys.reason


def test_harness_output_does_not_corrupt_the_result():
    h = src('import sys\nprint(\'{"ok": false}\')\nsys.stdout.write("noise")\n' + PLAIN)
    r = validate(h)
    assert r.ok, r.reason


def test_harness_code_never_runs_in_the_callers_process_nor_writes_the_host(tmp_path, monkeypatch):
    marker = tmp_path / "marker.txt"
    body = textwrap.dedent(
        f"""
        import os
        with open("relative_marker.txt", "w") as f:  # the sandbox's own empty working directory
            f.write("written at import")
        try:
            with open({str(marker)!r}, "w") as f:  # a host path: not visible in the sandbox
                f.write(f"{{os.getpid()}}\\n{{os.getcwd()}}")
        except OSError:
            pass
        MARKER_MODULE_LOADED = True
        """
    )
    h = Harness.from_source(body + PLAIN)
    monkeypatch.chdir(tmp_path)
    before = set(sys.modules)
    r = validate(h)
    assert r.ok, r.reason
    assert not marker.exists()
    assert not (tmp_path / "relative_marker.txt").exists()
    assert "harness" not in set(sys.modules) - before
    # vars(), not getattr(): some installed modules answer any attribute via __getattr__.
    assert not any(vars(m).get("MARKER_MODULE_LOADED") is True for m in list(sys.modules.values())
                   if hasattr(m, "__dict__"))


def test_validate_many_keeps_input_order_and_isolates_failures():
    hs = [
        src(PLAIN),
        src("def build_agent(model):\n    pass\n"),
        src("while True:\n    pass\n"),
        src("import os\n" + PLAIN),
    ]
    rs = validate_many(hs, timeout_s=5, max_workers=2)
    assert [r.ok for r in rs] == [True, False, False, True]
    assert [r.check for r in rs] == [None, "signature", "timeout", None]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"timeout_s": 0}, "timeout_s"), ({"memory_mb": -1}, "memory_mb"), ({"min_fragment_chars": 0}, "min_fragment_chars")],
)
def test_bad_options_raise_value_error_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        validate(src(PLAIN), **kwargs)


def test_validation_from_worker_threads_gives_the_same_results():
    # Drivers call validate through asyncio.to_thread; concurrent calls must not interfere.
    import asyncio

    hs = [src(PLAIN), src("def build_agent(model):\n    pass\n"), src("import os\n" + PLAIN)]

    async def run_all():
        return await asyncio.gather(*(asyncio.to_thread(validate, h) for h in hs))

    rs = asyncio.run(run_all())
    assert [(r.ok, r.check) for r in rs] == [(True, None), (False, "signature"), (True, None)]
