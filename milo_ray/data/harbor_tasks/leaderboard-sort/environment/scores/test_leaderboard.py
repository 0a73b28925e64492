import unittest

from scores.leaderboard import rank, top


class TestLeaderboard(unittest.TestCase):
    def test_highest_score_first(self):
        entries = [{"name": "ann", "score": 5, "time": 3.0}, {"name": "bob", "score": 9, "time": 4.0}]
        self.assertEqual([e["name"] for e in rank(entries)], ["bob", "ann"])

    def test_top(self):
        entries = [{"name": "a", "score": 1, "time": 1.0}, {"name": "b", "score": 2, "time": 1.0}]
        self.assertEqual(top(entries, 1), ["b"])


if __name__ == "__main__":
    unittest.main()
