import subprocess
import sys
import unittest

sys.path.insert(0, "/app")
import pager  # noqa: E402


class TestPager(unittest.TestCase):
    def test_page_count(self):
        cases = {(0, 3): 0, (1, 3): 1, (3, 3): 1, (4, 3): 2, (10, 3): 4, (9, 3): 3, (7, 1): 7}
        self.assertEqual({k: pager.page_count(*k) for k in cases}, cases)

    def test_paginate_pages(self):
        items = list(range(10))
        self.assertEqual([pager.paginate(items, p, 3) for p in (1, 2, 3, 4)], [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]])

    def test_paginate_past_end_and_empty(self):
        self.assertEqual(pager.paginate(list(range(10)), 5, 3), [])
        self.assertEqual(pager.paginate([], 1, 3), [])

    def test_paginate_rejects_bad_arguments(self):
        for args in ((0, 3), (-1, 3), (1, 0)):
            with self.assertRaises(ValueError):
                pager.paginate([1, 2], *args)

    def test_page_of(self):
        self.assertEqual([pager.page_of(i, 3) for i in range(8)], [1, 1, 1, 2, 2, 2, 3, 3])
        with self.assertRaises(ValueError):
            pager.page_of(-1, 3)

    def test_pages_cover_every_item_once(self):
        items = list(range(23))
        pages = [pager.paginate(items, p, 5) for p in range(1, pager.page_count(len(items), 5) + 1)]
        self.assertEqual(sum(pages, []), items)
        self.assertTrue(all(pager.page_of(i, 5) == p + 1 for p, page in enumerate(pages) for i in page))

    def test_own_tests_pass(self):
        proc = subprocess.run([sys.executable, "-m", "unittest", "test_pager"], cwd="/app", capture_output=True, text=True)
        self.assertEqual(proc.returncode, 0, proc.stderr[-1500:])


if __name__ == "__main__":
    unittest.main()
