"""Benchmark the numeric kernels against their baselines and print one table.

    python scripts/bench_kernels.py [--quick]

Every row is measured in this one run: ``ours`` and ``baseline`` are medians
over repeats (wall clock, seconds), ``ratio = ours / baseline`` (< 1 means we
are faster) and ``target`` is the acceptance bound.  Baselines: moocore (C) for
hypervolume; a plain Python double loop for the dominance matrix, timed on a
row subsample and extrapolated linearly to all rows (the table says so); the
naive greedy (every gain recomputed after every pick) for the RER order, whose
output is also compared with ours; direct O(n^2) convolution for the FFT.
``--quick`` skips the slow naive-greedy baseline at n = 2,000.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from milo_ray.kernels import autocorr, hypervolume, pareto, submodular  # noqa: E402
from milo_ray.testing.kernel_reference import naive_greedy  # noqa: E402


def timed(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def sphere_front(rng, n: int, d: int) -> np.ndarray:
    x = np.abs(rng.normal(size=(n, d)))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def loop_dominance(rows, F, eps):
    """The pass-primary rule as a plain Python double loop (the baseline)."""
    out = []
    for a in rows:
        line = []
        for b in F:
            d = a[0] - b[0]
            line.append(d > eps or (abs(d) <= eps and all(x > y for x, y in zip(a[1:], b[1:]))))
        out.append(line)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="skip the naive greedy at n=2,000")
    args = ap.parse_args()
    import moocore

    rng = np.random.default_rng(0)
    rows: list[tuple[str, str, float, float | None, str, str]] = []

    def add(kernel, size, ours, base, target, note=""):
        rows.append((kernel, size, ours, base, target, note))

    # Hypervolume: mutually non-dominated fronts (every point matters, the hard case).
    P2 = sphere_front(rng, 10_000, 2)
    t_ours, v_ours = timed(lambda: hypervolume.hypervolume(P2), 15)
    t_base, v_base = timed(lambda: moocore.hypervolume(P2, ref=np.zeros(2), maximise=True), 15)
    assert abs(v_ours - v_base) <= 1e-12 * v_base
    add("hypervolume 2-D (front)", "n=10,000", t_ours, t_base, "<= 2x moocore")

    P3 = sphere_front(rng, 1_000, 3)
    t_ours, v_ours = timed(lambda: hypervolume.hypervolume(P3), 15)
    t_base, v_base = timed(lambda: moocore.hypervolume(P3, ref=np.zeros(3), maximise=True), 15)
    assert abs(v_ours - v_base) <= 1e-12 * v_base
    add("hypervolume 3-D (front)", "n=1,000", t_ours, t_base, "<= 3x moocore")

    U3 = rng.random((1_000, 3))
    t_ours, v_ours = timed(lambda: hypervolume.hypervolume(U3), 15)
    t_base, v_base = timed(lambda: moocore.hypervolume(U3, ref=np.zeros(3), maximise=True), 15)
    assert abs(v_ours - v_base) <= 1e-12 * v_base
    add("hypervolume 3-D (uniform cube)", "n=1,000", t_ours, t_base, "(info)")

    C3 = sphere_front(rng, 200, 3)
    t_ours, c_ours = timed(lambda: hypervolume.hv_contributions(C3), 15)
    t_base, c_base = timed(lambda: moocore.hv_contributions(C3, ref=np.zeros(3), maximise=True), 15)
    assert np.allclose(c_ours, c_base, rtol=1e-12, atol=1e-15)
    add("hv_contributions 3-D (front)", "n=200", t_ours, t_base, "<= 5x moocore")

    # Dominance matrix vs a Python double loop (loop timed on a subsample, extrapolated).
    F = np.column_stack([rng.random(5_000), rng.random((5_000, 2))])
    t_ours, D = timed(lambda: pareto.dominance_matrix(F, eps=0.02), 5)
    sub = 100
    Fl = [tuple(r) for r in F.tolist()]
    t_sub, L = timed(lambda: loop_dominance(Fl[:sub], Fl, 0.02), 3)
    assert np.array_equal(np.asarray(L), D[:sub])
    add("dominance_matrix (3 obj)", "5,000 x 5,000", t_ours, t_sub * (5_000 / sub),
        "< 1 s and >= 20x loop", f"loop timed on {sub} rows x 5,000, x{5_000 // sub}")

    # RER greedy on dense clipped-cosine similarities.
    def rer_instance(n):
        Z = rng.normal(size=(n, 64)) + 0.3
        return rng.random(n), rng.random(n), submodular.clipped_cosine(Z)

    w, q, S = rer_instance(2_000)
    t_ours, order = timed(lambda: submodular.rer_order(w, q, S), 3)
    if args.quick:
        add("rer_order (dense S)", "n=2,000", t_ours, None, ">= 10x naive, same order", "naive skipped (--quick)")
    else:
        t_base, ref = timed(lambda: naive_greedy(w, q, S), 1)
        same = bool(np.array_equal(order, ref))
        add("rer_order (dense S)", "n=2,000", t_ours, t_base, ">= 10x naive, same order",
            f"identical order: {same}; density {np.mean(S > 0):.2f}")
    w, q, S = rer_instance(5_000)
    t_ours, _ = timed(lambda: submodular.rer_order(w, q, S), 1)
    add("rer_order (dense S)", "n=5,000", t_ours, None, "< 5 s", f"density {np.mean(S > 0):.2f}")

    # EinsteinArena scores.
    h = rng.random(65_536)
    t_ours, _ = timed(lambda: autocorr.first_autocorrelation(h), 21)
    add("first_autocorrelation (fft)", "n=65,536", t_ours, None, "< 20 ms")
    h = rng.random(16_384)
    t_ours, a = timed(lambda: autocorr.autoconvolution(h), 21)
    t_base, b = timed(lambda: autocorr.autoconvolution(h, method="direct"), 3)
    assert np.max(np.abs(a - b)) <= 1e-12 * np.max(np.abs(b))
    add("autoconvolution fft vs direct", "n=16,384", t_ours, t_base, ">= 50x direct")

    def fmt(t):
        if t is None:
            return "—"
        return f"{t * 1e3:.3f} ms" if t < 1 else f"{t:.2f} s"

    header = ("kernel", "size", "ours", "baseline", "ratio", "target", "note")
    table = [header]
    for kernel, size, ours, base, target, note in rows:
        ratio = "—" if base is None else (f"{ours / base:.2f}x" if ours >= base else f"1/{base / ours:.1f}")
        table.append((kernel, size, fmt(ours), fmt(base), ratio, target, note))
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(c.ljust(wd) for c, wd in zip(r, widths)) + " |"  # noqa: E731
    print(line(header))
    print("|" + "|".join("-" * (wd + 2) for wd in widths) + "|")
    for r in table[1:]:
        print(line(r))
    print("\nratio = ours / baseline (1/N means N times faster than the baseline); medians of repeats.")


if __name__ == "__main__":
    main()
