"""A tiny git repository with one SWE-style bug, for tests of SWE rows: ``calc.sub`` adds
instead of subtracting. The base commit has a passing ``test_add``; the test patch adds a
failing ``test_sub``; the gold patch fixes ``sub``. Both patches are real ``git diff``
output against the base commit, so graders apply them exactly as a dataset's would."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

_BUGGY = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a + b\n"
_FIXED = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
_TEST_ADD = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
_TEST_BOTH = ("from calc import add, sub\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n"
              "def test_sub():\n    assert sub(5, 3) == 2\n")

FAIL_TO_PASS = ["tests/test_calc.py::test_sub"]
PASS_TO_PASS = ["tests/test_calc.py::test_add"]


@dataclass(frozen=True)
class CalcRepo:
    path: Path
    base_commit: str
    gold_patch: str
    test_patch: str


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                          capture_output=True, text=True).stdout


def calc_repo(path: Path, extra_files: dict[str, str] | None = None) -> CalcRepo:
    """Create the repository at ``path`` (left at its base commit, clean); ``extra_files``
    (relative path -> text) are committed with the base."""
    (path / "calc").mkdir(parents=True)
    (path / "tests").mkdir()
    for rel, text in {"calc/__init__.py": _BUGGY, "tests/test_calc.py": _TEST_ADD, **(extra_files or {})}.items():
        (path / rel).write_text(text)
    git(path, "init", "-q")
    git(path, "add", ".")
    git(path, "commit", "-qm", "base")
    base = git(path, "rev-parse", "HEAD").strip()
    (path / "tests" / "test_calc.py").write_text(_TEST_BOTH)
    test_patch = git(path, "diff")
    git(path, "checkout", "-q", ".")
    (path / "calc" / "__init__.py").write_text(_FIXED)
    gold = git(path, "diff")
    git(path, "checkout", "-q", ".")
    return CalcRepo(path, base, gold, test_patch)
