import unittest

from textutils.slug import slugify


class TestSlug(unittest.TestCase):
    def test_ascii(self):
        self.assertEqual(slugify("Hello, World!"), "hello-world")

    def test_accents_are_kept_as_letters(self):
        self.assertEqual(slugify("Crème Brûlée"), "creme-brulee")


if __name__ == "__main__":
    unittest.main()
