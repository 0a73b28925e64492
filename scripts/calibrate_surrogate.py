"""Print the surrogate calibration table: every seed's exact quality per split,
the reachable optimum on test, and the gap to the best seed.

    python scripts/calibrate_surrogate.py [--seed 0] [--presets surrogate_tb21 ...] [--calibrate-to stock]
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from milo_ray.benchmarks.surrogate import PRESETS, SurrogateBenchmark  # noqa: E402
from milo_ray.harness.seeds import load_seeds  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--presets", nargs="*", default=list(PRESETS))
    ap.add_argument("--calibrate-to", default=None,
                    help="the seed put on the target (benchmark.calibrate_to; default: the best seed)")
    args = ap.parse_args()
    for name in args.presets:
        b = SurrogateBenchmark(name, seed=args.seed, calibrate_to=args.calibrate_to)
        print(f"\n== {name} (seed {args.seed}; target {args.calibrate_to or 'best-seed'} test resolve "
              f"{b.preset.target_resolve:.3f}; "
              f"effect_scale {b.preset.effect_scale}; offset {b.offset:+.3f})")
        print(f"{'harness':<20}{'split':<7}{'score':>8}{'resolve':>9}{'out_tok':>10}{'seconds':>9}")
        best_seed = 0.0
        for h in load_seeds(b.preset.seed_names):
            for split in b.splits():
                q = b.true_quality(h, split)
                if split == "test":
                    best_seed = max(best_seed, q["resolve_rate"])
                print(f"{h.name:<20}{split:<7}{q['score']:>8.3f}{q['resolve_rate']:>9.3f}"
                      f"{q['output_tokens']:>10,.0f}{q['seconds']:>9,.0f}")
        for metric in ("resolve_rate", "score"):
            br = b.best_reachable("test", metric=metric)
            q = br["quality"]
            print(f"best_reachable[{metric}] over {br['subsets_evaluated']} sets: score {q['score']:.3f} "
                  f"resolve {q['resolve_rate']:.3f} tokens {q['output_tokens']:,.0f} seconds {q['seconds']:,.0f}")
            print("   mechanisms:", ", ".join(f"{k}{v or ''}" for k, v in br["mechanisms"].items()))
            if metric == "resolve_rate":
                print(f"   gap to best seed (test resolve): {q['resolve_rate'] - best_seed:+.3f}")


if __name__ == "__main__":
    main()
