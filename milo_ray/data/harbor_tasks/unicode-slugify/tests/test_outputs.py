import subprocess
import sys
import unittest

sys.path.insert(0, "/app")
from textutils.slug import slugify  # noqa: E402


class TestSlugify(unittest.TestCase):
    def test_ascii_titles(self):
        self.assertEqual(slugify("Hello, World!"), "hello-world")
        self.assertEqual(slugify("  --Python 3.11 -- released  "), "python-3-11-released")

    def test_accents(self):
        self.assertEqual(slugify("Crème Brûlée"), "creme-brulee")
        self.assertEqual(slugify("Ångström São Paulo Ñandú"), "angstrom-sao-paulo-nandu")

    def test_casefold(self):
        self.assertEqual(slugify("Straße"), "strasse")

    def test_compatibility_forms(self):
        self.assertEqual(slugify("ﬁnal ＡＢＣ １２３"), "final-abc-123")
        self.assertEqual(slugify("x² ½"), "x2-1-2")

    def test_truncation_leaves_no_trailing_hyphen(self):
        self.assertEqual(slugify("abc def ghi", max_length=4), "abc")
        self.assertEqual(slugify("abc def ghi", max_length=7), "abc-def")
        self.assertEqual(len(slugify("word " * 40)), 49)

    def test_untitled(self):
        self.assertEqual(slugify(""), "untitled")
        self.assertEqual(slugify("日本語 !!!"), "untitled")
        self.assertEqual(slugify("  --  "), "untitled")

    def test_mixed_scripts(self):
        self.assertEqual(slugify("Café 東京 2024"), "cafe-2024")

    def test_own_tests_pass(self):
        proc = subprocess.run([sys.executable, "-m", "unittest", "textutils.test_slug"], cwd="/app",
                              capture_output=True, text=True)
        self.assertEqual(proc.returncode, 0, proc.stderr[-1500:])


if __name__ == "__main__":
    unittest.main()
