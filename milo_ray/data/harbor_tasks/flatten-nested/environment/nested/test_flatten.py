import unittest

from nested.flatten import flatten


class TestFlatten(unittest.TestCase):
    def test_docstring_example(self):
        self.assertEqual(flatten({"a": {"b": [1, {"c": 2}]}, "d": {}}), {"a.b.0": 1, "a.b.1.c": 2, "d": {}})

    def test_calls_are_independent(self):
        self.assertEqual(flatten({"x": 1}), {"x": 1})
        self.assertEqual(flatten({"y": 2}), {"y": 2})


if __name__ == "__main__":
    unittest.main()
