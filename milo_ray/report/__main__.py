"""``python -m milo_ray.report RUN_DIR [--out DIR]`` writes one run's report;
``python -m milo_ray.report --compare PATH... [--out DIR]`` (run or sweep directories)
writes one comparison page. Prints the written page's path. Exit 2 on bad input
(a path that does not exist, a directory that is not a readable run, a run written
by a newer schema), with the reason on stderr.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m milo_ray.report",
        description="Write a self-contained HTML report of a run, or a comparison page of several runs.")
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="a run directory or s3://BUCKET/PREFIX (with --compare: run directories and/or sweep "
                        "directories)")
    p.add_argument("--compare", action="store_true",
                   help="compare the runs under PATH... on one page (table + plot with 95%% CIs)")
    p.add_argument("--out", type=Path, default=None,
                   help="output directory (default: RUN_DIR/report, ./<run name>/report for s3://...; with --compare, "
                        "PATH/comparison for one PATH)")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    from milo_ray import results
    from milo_ray.report import write_comparison, write_report

    from milo_ray.store.remote import is_uri

    # s3://BUCKET/PREFIX paths are read from the bucket (milo_ray.results)
    missing = [p for p in args.paths if not is_uri(p) and not Path(p).exists()]
    if missing:
        parser.exit(2, f"error: no such directory: {missing[0]}\n")
    try:
        if args.compare:
            out = args.out
            if out is None:
                if len(args.paths) != 1:
                    parser.exit(2, "error: --out DIR is required when comparing more than one PATH\n")
                first = args.paths[0]
                out = (Path(first.rstrip("/").rsplit("/", 1)[-1]) if is_uri(first) else Path(first)) / "comparison"
            path = write_comparison(args.paths, out)
        else:
            if len(args.paths) != 1:
                parser.exit(2, f"error: one RUN_DIR expected, got {len(args.paths)} "
                               "(use --compare to put several runs on one page)\n")
            path = write_report(args.paths[0], args.out)
    except results.RunDirError as e:
        parser.exit(2, f"error: {e}\n")
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
