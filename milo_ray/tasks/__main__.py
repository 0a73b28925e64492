"""``python -m milo_ray.tasks check PATH [options] [overrides ...]``: a verdict per task of a
Harbor directory or a SWE JSONL file (:mod:`milo_ray.tasks`). Overrides are a run's
(``sandbox=docker``, ``benchmark.test_cmd='pytest -rA'``, ``execution.num_cpus=2``).

Exit codes: 0 every task ok, 1 some task is not ok (the table says which and why),
2 bad input (one message, nothing written).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")

EXIT_OK, EXIT_NOT_OK, EXIT_BAD_INPUT = 0, 1, 2


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m milo_ray.tasks", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check", help="a verdict per task: ok, trivial, broken, flaky, needs-network, needs-docker, "
                                     "unrunnable")
    c.add_argument("path", help="a directory of Harbor task directories (or one task), or a JSONL file of SWE rows")
    c.add_argument("overrides", nargs="*", help="config overrides as a run takes them, e.g. sandbox=docker")
    c.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="runs of each reference solution (2 or more finds flaky verifiers; default 1)")
    c.add_argument("--no-noop", action="store_true", help="skip the do-nothing agent (trivial tasks then show as ok)")
    c.add_argument("--out", type=Path, default=None,
                   help="directory for verdicts.parquet and verdicts.md (default task_checks/<suite>-<time>)")
    c.add_argument("--split-file", type=Path, default=None, metavar="FILE",
                   help="write the ok tasks, divided by benchmark.splits/split_seed, as JSON for benchmark.split_file=")
    c.add_argument("--progress", action="store_true", help="a live progress line while the rollouts run")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    # Overrides may come before or after the options (argparse alone takes them only before).
    args, rest = p.parse_known_args(argv)
    unknown = [r for r in rest if r.startswith("-")]
    if unknown:
        p.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.overrides = [*args.overrides, *rest]
    from milo_ray.config.errors import UserError
    from milo_ray.tasks.check import run_check
    from milo_ray.tasks.output import print_table, write, write_split_file

    try:
        result = run_check(args.path, args.overrides, repeat=args.repeat, noop=not args.no_noop,
                           progress=None if args.progress else False)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    out = args.out or Path("task_checks") / f"{Path(result.suite).stem}-{time.strftime('%Y-%m-%d_%H-%M-%S')}"
    print_table(result)
    paths = write(result, out)
    print(f"verdicts: {paths['parquet']} and {paths['markdown']}")
    if args.split_file is not None:
        try:
            splits = write_split_file(result, args.split_file)
        except ValueError as exc:
            print(f"error: --split-file: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
        sizes = ", ".join(f"{k}: {len(v)}" for k, v in splits.items())
        print(f"split file of the ok tasks ({sizes}): {args.split_file} -- use benchmark.split_file={args.split_file}")
    return EXIT_OK if all(v.verdict == "ok" for v in result.verdicts) else EXIT_NOT_OK


if __name__ == "__main__":
    sys.exit(main())
