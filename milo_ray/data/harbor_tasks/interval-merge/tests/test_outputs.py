import copy
import random
import sys
import unittest

sys.path.insert(0, "/app")
from intervals.ops import gaps, merge, subtract, total_length  # noqa: E402


def points(intervals, lo=-5, hi=45):
    """Covered half-integer points: canonical forms over ints are equal iff these are."""
    return {x / 2 for x in range(2 * lo, 2 * hi) if any(s <= x / 2 < e for s, e in intervals)}


def canonical(result):
    """Sorted, disjoint, non-empty tuples separated by real gaps."""
    ok = all(type(iv) is tuple and len(iv) == 2 and iv[0] < iv[1] for iv in result)
    return ok and all(a[1] < b[0] for a, b in zip(result, result[1:]))


def random_intervals(rng, n=None):
    out = []
    for _ in range(rng.randint(0, 8) if n is None else n):
        s = rng.randint(0, 30)
        out.append((s, s + rng.randint(0, 8)) if rng.random() < 0.7 else [s, s + rng.randint(0, 3)])
    return out


class TestMerge(unittest.TestCase):
    def test_basic_and_touching(self):
        self.assertEqual(merge([(1, 3), (3, 5)]), [(1, 5)])
        self.assertEqual(merge([(5, 8), (1, 2), (2, 3), (10, 11), (6, 7)]), [(1, 3), (5, 8), (10, 11)])

    def test_empty_intervals_and_input(self):
        self.assertEqual(merge([]), [])
        self.assertEqual(merge([(4, 4), (1, 1)]), [])
        self.assertEqual(merge([(1, 2), (2, 2), (3, 4)]), [(1, 2), (3, 4)])

    def test_invalid_raises(self):
        for bad in ([(3, 1)], [(0, 1), (5, 4.5)]):
            with self.assertRaises(ValueError):
                merge(bad)

    def test_lists_generators_floats_and_no_mutation(self):
        data = [[0.5, 1.5], [1.25, 2.0], (3, 4)]
        before = copy.deepcopy(data)
        self.assertEqual(merge(iter(data)), [(0.5, 2.0), (3, 4)])
        self.assertEqual(data, before)

    def test_random_merge(self):
        rng = random.Random(1)
        for _ in range(400):
            data = random_intervals(rng)
            got = merge(data)
            self.assertTrue(canonical(got), got)
            self.assertEqual(points(got), points(data), data)


class TestOthers(unittest.TestCase):
    def test_total_length(self):
        self.assertEqual(total_length([]), 0)
        self.assertEqual(total_length([(0, 10), (5, 15), (20, 21), (7, 7)]), 16)
        self.assertAlmostEqual(total_length([(0.5, 1.0), (0.75, 2.0)]), 1.5)
        with self.assertRaises(ValueError):
            total_length([(2, 1)])

    def test_subtract_examples(self):
        self.assertEqual(subtract([(0, 10)], [(2, 3), (5, 7)]), [(0, 2), (3, 5), (7, 10)])
        self.assertEqual(subtract([(0, 5), (5, 10)], [(0, 10)]), [])
        self.assertEqual(subtract([(0, 5)], []), [(0, 5)])
        self.assertEqual(subtract([(0, 4), (6, 9)], [(3, 7), (8, 8)]), [(0, 3), (7, 9)])
        with self.assertRaises(ValueError):
            subtract([(0, 5)], [(4, 3)])

    def test_random_subtract(self):
        rng = random.Random(2)
        for _ in range(300):
            a, b = random_intervals(rng), random_intervals(rng)
            a_before, b_before = copy.deepcopy(a), copy.deepcopy(b)
            got = subtract(a, b)
            self.assertTrue(canonical(got), got)
            self.assertEqual(points(got), points(a) - points(b), (a, b))
            self.assertEqual((a, b), (a_before, b_before))

    def test_gaps_examples(self):
        self.assertEqual(gaps([], 0, 5), [(0, 5)])
        self.assertEqual(gaps([(1, 2)], 0, 0), [])
        self.assertEqual(gaps([(1, 2), (2, 3), (6, 20)], 0, 10), [(0, 1), (3, 6)])
        self.assertEqual(gaps([(-5, 50)], 0, 10), [])
        with self.assertRaises(ValueError):
            gaps([], 5, 4)

    def test_random_gaps_and_length(self):
        rng = random.Random(3)
        for _ in range(300):
            data = random_intervals(rng)
            lo = rng.randint(-3, 20)
            hi = lo + rng.randint(0, 25)
            got = gaps(data, lo, hi)
            self.assertTrue(canonical(got), got)
            self.assertEqual(points(got), points([(lo, hi)]) - points(data), (data, lo, hi))
            self.assertEqual(total_length(data), len(points(data)) / 2)


if __name__ == "__main__":
    unittest.main()
