"""The commands in the tutorials and how-to guides work as written.

Every ```bash block of ``docs/tutorials`` and ``docs/how-to`` is either run by the slow
test below -- the blocks of one page in order, in one scratch directory that sees the
checkout's code and configs, offline -- or marked on the line before it with
``<!-- not run: REASON -->`` (it needs a model endpoint, a cloud account, a cluster, or
hours). And every ``python -m milo_ray.run`` command on those pages, run or not, composes
and passes the run's config checks (keys, groups, options, types), so a renamed key or
option fails the default suite even where its block cannot run here.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([*ROOT.glob("docs/tutorials/*.md"), *ROOT.glob("docs/how-to/*.md")])
_NOT_RUN = re.compile(r"<!--\s*not run:\s*(.*?)\s*-->")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    text: str
    not_run: str | None  # the reason given, or None: the block runs


def blocks(page: Path) -> list[Block]:
    found: list[Block] = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```bash":
            j = i + 1
            while lines[j].strip() != "```":
                j += 1
            before = next((ln for ln in reversed(lines[:i]) if ln.strip()), "")
            m = _NOT_RUN.search(before)
            found.append(Block(page, i + 1, "\n".join(lines[i + 1:j]), m.group(1) if m else None))
            i = j
        i += 1
    return found


def commands(text: str) -> list[str]:
    """The shell commands of a block: continuation lines joined, comments dropped."""
    out, cur = [], ""
    for ln in text.splitlines():
        ln = ln.rstrip()
        cur += ln[:-1] + " " if ln.endswith("\\") else ln
        if not ln.endswith("\\"):
            if cur.strip() and not cur.lstrip().startswith("#"):
                out.append(cur.strip())
            cur = ""
    return out


def _run_overrides(cmd: str) -> list[str] | None:
    """The overrides of a ``python -m milo_ray.run`` command (the first point of a sweep),
    or None for another command."""
    words = shlex.split(cmd, comments=True)
    if words[:3] != ["python", "-m", "milo_ray.run"]:
        return None
    args = [w for w in words[3:] if w not in ("-m", "--multirun")]
    if any(a.startswith("--") for a in args):
        return []  # --help, --cfg job: nothing of a run's own to check
    # A sweep's first point: the first value of each comma-separated list (not inside brackets).
    return [re.sub(r"^([^=\[{]+=)([^,\[{]+),.*$", r"\1\2", a) for a in args]


ALL_BLOCKS = [b for p in PAGES for b in blocks(p)]
# Key variables the pages' models read by default (a command that names none relies on them).
_PROVIDER_KEYS = ["OPENAI_API_KEY", "ANTHROPIC_API_KEY", "HOSTED_VLLM_API_KEY"]


def test_every_block_runs_or_says_why_not():
    assert len(ALL_BLOCKS) >= 20, "the tutorials and how-to guides hold fewer command blocks than expected"
    for b in ALL_BLOCKS:
        assert b.not_run is None or len(b.not_run) >= 10, (
            f"{b.page.relative_to(ROOT)}:{b.line}: '<!-- not run: ... -->' must say why")
    assert any(b.not_run is None for b in ALL_BLOCKS)


RUN_COMMANDS = [(b, cmd) for b in ALL_BLOCKS for cmd in commands(b.text) if _run_overrides(cmd) is not None]


def _placeholders(overrides: list[str]) -> None:
    """The user's own data a command names (a task directory, a JSONL of rows, a split file an
    earlier command writes), made as empty placeholders: the checks below build nothing, so
    only the paths' existence counts."""
    for o in overrides:
        key, _, value = o.partition("=")
        if key in ("benchmark.path", "benchmark.split_file") and not Path(value).exists():
            where = Path(value)
            if where.suffix:
                where.parent.mkdir(parents=True, exist_ok=True)
                where.write_text("")
            else:
                where.mkdir(parents=True)


def test_every_run_command_on_the_pages_composes_and_passes_the_config_checks(monkeypatch, tmp_path):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from milo_ray.config.errors import UserError
    from milo_ray.config.paths import conf_dir
    from milo_ray.run import check_composition, check_settings

    assert len(RUN_COMMANDS) >= 15
    # The shell's view: $HOME expanded (to a scratch home) and the keys exported.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for name in {n for _, c in RUN_COMMANDS for n in re.findall(r"api_key_env=(\w+)", c)} | set(_PROVIDER_KEYS):
        monkeypatch.setenv(name, "doc-test-placeholder-key")
    failures = []
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        for block, cmd in RUN_COMMANDS:
            overrides = [os.path.expandvars(o) for o in _run_overrides(cmd)
                         if not o.startswith(("run.resume=", "hydra"))]
            _placeholders(overrides)
            try:
                cfg = compose("config", overrides=overrides)
                check_settings(cfg)
                check_composition(cfg)
            except (UserError, Exception) as exc:  # a Hydra parse or composition error as well
                failures.append(f"{block.page.relative_to(ROOT)}:{block.line}: {cmd}\n    {type(exc).__name__}: {exc}")
    GlobalHydra.instance().clear()
    assert not failures, "commands on the docs pages that a run would refuse:\n" + "\n".join(failures)


def _scratch(tmp_path: Path) -> Path:
    """A working directory that sees the checkout's code, configs and scripts (as a user's
    checkout does) and keeps what the commands write."""
    work = tmp_path / "work"
    work.mkdir()
    for name in ("milo_ray", "conf", "scripts", "tests", "pyproject.toml", "hydra_plugins"):
        (work / name).symlink_to(ROOT / name)
    return work


RUN_PAGES = sorted({b.page for b in ALL_BLOCKS if b.not_run is None})


@pytest.mark.slow
@pytest.mark.parametrize("page", RUN_PAGES, ids=[p.stem for p in RUN_PAGES])
def test_the_runnable_blocks_of_a_page_run_in_order(page, tmp_path):
    work = _scratch(tmp_path)
    # Ray's socket paths must stay under 108 bytes: a short directory of its own, not tmp_path.
    ray_tmp = tempfile.mkdtemp(prefix="rt-doc-", dir="/tmp")
    env = {**os.environ, "CI": "true", "RAY_TMPDIR": ray_tmp, "PYTHONPATH": str(ROOT),
           "MILO_RAY_DOC_TEST": "1"}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    for b in (b for b in blocks(page) if b.not_run is None):
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", b.text], cwd=work, env=env, capture_output=True,
                              text=True, timeout=1500)
        assert done.returncode == 0, (f"{page.relative_to(ROOT)}:{b.line} failed (exit {done.returncode}):\n"
                                      f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
