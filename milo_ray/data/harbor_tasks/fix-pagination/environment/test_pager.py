import unittest

from pager import page_count, page_of, paginate


class TestPager(unittest.TestCase):
    def test_first_page(self):
        self.assertEqual(paginate(list(range(10)), 1, 3), [0, 1, 2])

    def test_page_count_partial_last_page(self):
        self.assertEqual(page_count(10, 3), 4)

    def test_page_of_first_item(self):
        self.assertEqual(page_of(0, 5), 1)


if __name__ == "__main__":
    unittest.main()
