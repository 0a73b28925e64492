import copy
import random
import subprocess
import sys
import unittest

sys.path.insert(0, "/app")
from scores.leaderboard import rank, top  # noqa: E402


def e(name, score, time):
    return {"name": name, "score": score, "time": time}


def reference(entries):
    ordered = sorted(entries, key=lambda x: (-x["score"], x["time"], x["name"].lower()))
    out = []
    for i, x in enumerate(ordered):
        tied = out and (out[-1]["score"], out[-1]["time"]) == (x["score"], x["time"])
        out.append({**x, "rank": out[-1]["rank"] if tied else i + 1})
    return out


class TestRank(unittest.TestCase):
    def test_score_descending(self):
        got = rank([e("a", 1, 1.0), e("b", 3, 1.0), e("c", 2, 1.0)])
        self.assertEqual([x["name"] for x in got], ["b", "c", "a"])

    def test_time_breaks_score_ties(self):
        got = rank([e("a", 5, 9.5), e("b", 5, 2.25), e("c", 5, 4.0)])
        self.assertEqual([x["name"] for x in got], ["b", "c", "a"])

    def test_name_case_insensitive_last(self):
        got = rank([e("bob", 5, 1.0), e("Alice", 5, 1.0), e("carl", 5, 1.0)])
        self.assertEqual([x["name"] for x in got], ["Alice", "bob", "carl"])

    def test_competition_ranks(self):
        got = rank([e("a", 9, 1.0), e("b", 7, 2.0), e("c", 7, 2.0), e("d", 5, 1.0), e("f", 7, 3.0)])
        self.assertEqual([(x["name"], x["rank"]) for x in got], [("a", 1), ("b", 2), ("c", 2), ("f", 4), ("d", 5)])

    def test_input_not_mutated(self):
        entries = [e("a", 1, 1.0), e("b", 2, 1.0)]
        before = copy.deepcopy(entries)
        got = rank(entries)
        self.assertEqual(entries, before)
        self.assertFalse(any(g is x for g in got for x in entries))

    def test_random_against_reference(self):
        rng = random.Random(7)
        for _ in range(200):
            entries = [e(rng.choice(["ann", "Bob", "bob", "Cy", "dee", "Eve"]) + str(rng.randint(0, 3)),
                         rng.randint(0, 4), rng.choice([1.0, 1.5, 2.0])) for _ in range(rng.randint(0, 9))]
            self.assertEqual(rank(entries), reference(entries))

    def test_top(self):
        self.assertEqual(top([e("a", 1, 1.0), e("b", 3, 1.0), e("c", 2, 1.0)], 2), ["b", "c"])
        self.assertEqual(top([e("a", 1, 1.0)], 5), ["a"])

    def test_own_tests_pass(self):
        proc = subprocess.run([sys.executable, "-m", "unittest", "scores.test_leaderboard"], cwd="/app",
                              capture_output=True, text=True)
        self.assertEqual(proc.returncode, 0, proc.stderr[-1500:])


if __name__ == "__main__":
    unittest.main()
