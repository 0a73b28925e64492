"""Which third of the slow tests and of the mutations a CI run checks.

CI has a fixed time budget, and the slow suite and the mutation check together cost
more than it allows. So each CI run checks one *part* of each (of ``PARTS``), plus
whatever the latest commits touched, and over consecutive commits the parts rotate:

* the part of a commit is its position in the history (``git rev-list --count``)
  modulo ``PARTS``, so any ``PARTS`` consecutive commits check every part once;
* a slow test file and a mutation belong to the part given by a stable hash of their
  name (a test file's path relative to the repository, a mutation's name), so adding
  or reordering tests or mutations never moves the others between parts;
* the mutation check also takes, whatever their part, the mutations whose guarded
  file (the one they break) the latest ``TOUCHED_COMMITS`` commits changed. The slow
  suite takes its part only: its files are large, and a change that touches many of them
  would otherwise run them all and overrun CI's budget.

A landing of several commits moves the rotation on by its number of commits, so the
guarantee is over consecutive commits. A CI system that numbers its runs can make it one
over consecutive runs: given ``MILO_CI_RUN_NUMBER`` (an integer), the part is that number
modulo ``PARTS``. A shallow clone has no position to count; it falls back to the commit
hash (still deterministic, with no three-commit guarantee) and says so.

    python scripts/ci_rotation.py            # this checkout's part and touched files
    python scripts/ci_rotation.py --slow-junit /tmp/milo-ray-ci-slow.xml \
        --mutation-log /tmp/milo-ray-ci-mutations.log   # seconds per part, as last measured
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
import zlib
from dataclasses import dataclass
from pathlib import Path

PARTS = 3
RUN_NUMBER_ENV = "MILO_CI_RUN_NUMBER"
# Bounded by count rather than by time, so that CI's share of the mutation check stays
# bounded whatever a landing contains.
TOUCHED_COMMITS = 3
# Chosen so that the three parts of the slow suite and of the mutation check take about
# the same time as last measured (`--slow-junit ... --mutation-log ...` prints them: slow
# 8.7 / 9.2 / 9.3 min, mutations 8.4 / 8.0 / 8.6 min of checks, from `bash .ci/run --all`).
# A new salt reshuffles every part, so the commit that changes it should run --all.
SALT = "milo-ci-11098"


def part_of(name: str, *, salt: str = SALT, parts: int = PARTS) -> int:
    """The part a slow test file (its repository-relative path) or a mutation (its name)
    belongs to: a stable hash, independent of what else exists."""
    return zlib.crc32(f"{salt}:{name}".encode()) % parts


@dataclass(frozen=True)
class Rotation:
    """What one CI run checks beyond its part: the part itself, and the repository files
    the change being landed touched."""

    part: int
    touched: frozenset[str]
    why: str

    def runs_slow_file(self, path: str) -> bool:
        """True when this run takes the slow tests of ``path`` (repository-relative)."""
        return part_of(path) == self.part

    def checks_mutation(self, name: str, guarded_file: str) -> bool:
        """True when this run checks the mutation: it is in this part, or the file it
        breaks changed in the latest commits."""
        return part_of(name) == self.part or guarded_file in self.touched

    def with_part(self, part: int) -> Rotation:
        """The same touched files with another part (a part chosen on the command line)."""
        return Rotation.chosen(part, touched=self.touched)

    @staticmethod
    def chosen(part: int, *, touched: frozenset[str] = frozenset()) -> Rotation:
        """A part chosen on the command line (no git history needed)."""
        if not 0 <= part < PARTS:
            raise ValueError(f"a rotation part is 0..{PARTS - 1}, got {part}")
        return Rotation(part=part, touched=touched, why=f"part {part} of {PARTS}, chosen on the command line")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()


def rotation_of(repo: Path) -> Rotation:
    """The rotation of the checkout at ``repo`` (its HEAD commit), or of the CI run
    ``MILO_CI_RUN_NUMBER`` names."""
    run_number = os.environ.get(RUN_NUMBER_ENV, "").strip()
    if run_number:
        if not run_number.isdigit():
            raise ValueError(f"{RUN_NUMBER_ENV}={run_number!r}: expected a non-negative integer (the CI run's number)")
        part = int(run_number) % PARTS
        why = f"CI run {run_number} ({RUN_NUMBER_ENV}): part {part} of {PARTS}"
    elif _git(repo, "rev-parse", "--is-shallow-repository") == "true":
        head = _git(repo, "rev-parse", "HEAD")
        part = int(head[:8], 16) % PARTS
        why = f"shallow clone: part {part} from the commit hash {head[:12]} (no rotation guarantee)"
    else:
        count = int(_git(repo, "rev-list", "--count", "HEAD"))
        part = count % PARTS
        why = f"commit {count} of the history: part {part} of {PARTS}"
    names = _git(repo, "log", f"-{TOUCHED_COMMITS}", "--name-only", "--format=")
    touched = frozenset(line for line in names.splitlines() if line)
    return Rotation(part=part, touched=touched, why=why)


def seconds_per_part(durations: dict[str, float], *, salt: str = SALT, parts: int = PARTS) -> list[float]:
    """Seconds per part for items with measured durations (name -> seconds)."""
    out = [0.0] * parts
    for name, secs in durations.items():
        out[part_of(name, salt=salt, parts=parts)] += secs
    return out


def slow_file_seconds(junit_xml: Path) -> dict[str, float]:
    """Seconds per test file (setup, call and teardown) from a pytest ``--junitxml`` report."""
    out: dict[str, float] = {}
    for case in ET.parse(junit_xml).iter("testcase"):
        path = case.get("classname", "").split("@", 1)[0]
        # classname is the dotted module path plus any class: tests.entry.test_x[.Class]
        parts = path.split(".")
        while parts and not parts[-1].startswith("test_"):
            parts.pop()
        if parts:
            key = "/".join(parts) + ".py"
            out[key] = out.get(key, 0.0) + float(case.get("time", 0.0))
    return out


def mutation_seconds(log: Path) -> dict[str, float]:
    """Seconds per mutation from scripts/mutation_check.py's closing table."""
    rows = re.findall(r"^\| ([\w-]+) \| [^|]+ \| (\d+) \|", log.read_text(), flags=re.M)
    return {name: float(secs) for name, secs in rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slow-junit", type=Path, help="a slow suite's --junitxml report: print its seconds per part")
    ap.add_argument("--mutation-log", type=Path, help="a mutation check's output: print its seconds per part")
    args = ap.parse_args(argv)
    for what, path, read in (("slow suite", args.slow_junit, slow_file_seconds),
                             ("mutation check", args.mutation_log, mutation_seconds)):
        if path is not None:
            secs = read(path)
            per_part = ", ".join(f"part {i}: {s / 60:.1f} min" for i, s in enumerate(seconds_per_part(secs)))
            print(f"{what}: {len(secs)} items, {sum(secs.values()) / 60:.1f} min in all; {per_part}")
    if args.slow_junit or args.mutation_log:
        return 0
    rot = rotation_of(Path.cwd())
    print(rot.why)
    print(f"touched by the latest commits ({len(rot.touched)} files):")
    for f in sorted(rot.touched):
        print(f"  {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
