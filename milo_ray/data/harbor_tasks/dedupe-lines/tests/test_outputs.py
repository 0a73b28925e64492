import json
import unittest
from pathlib import Path

CLEAN = Path("/app/output/subscribers_clean.txt")
EXPECTED = ["alice@example.com", "bob@example.com", "carol@example.org", "dave@example.net",
            "erin@example.com", "frank@example.com", "grace@example.com", "heidi@example.com"]


def lines():
    return CLEAN.read_text().splitlines()


class TestDedupe(unittest.TestCase):
    def test_no_duplicates(self):
        self.assertEqual(len(lines()), len(set(lines())))

    def test_trimmed_and_lowercased(self):
        for line in lines():
            self.assertEqual(line, line.strip().lower())

    def test_no_blank_lines(self):
        self.assertNotIn("", [line.strip() for line in lines()])

    def test_first_appearance_order_and_content(self):
        self.assertEqual(lines(), EXPECTED)

    def test_single_trailing_newline(self):
        text = CLEAN.read_text()
        self.assertTrue(text.endswith("com\n"), repr(text[-10:]))

    def test_stats(self):
        stats = json.loads(Path("/app/output/stats.json").read_text())
        self.assertEqual(stats, {"input_lines": 16, "blank_lines": 3, "unique": 8, "duplicates_removed": 5})

    def test_input_unchanged(self):
        self.assertEqual(len(Path("/app/data/subscribers.txt").read_text().split("\n")), 17)


if __name__ == "__main__":
    unittest.main()
