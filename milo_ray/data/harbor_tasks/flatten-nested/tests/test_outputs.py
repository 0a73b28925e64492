import copy
import subprocess
import sys
import unittest

sys.path.insert(0, "/app")
from nested.flatten import flatten  # noqa: E402


class TestFlatten(unittest.TestCase):
    def test_docstring_example(self):
        self.assertEqual(flatten({"a": {"b": [1, {"c": 2}]}, "d": {}}), {"a.b.0": 1, "a.b.1.c": 2, "d": {}})

    def test_independent_calls(self):
        first = flatten({"x": {"y": 1}})
        self.assertEqual(flatten({"z": 2}), {"z": 2})
        self.assertEqual(first, {"x.y": 1})
        self.assertIsNot(flatten({"q": 1}), flatten({"q": 1}))

    def test_lists_of_scalars_and_nested_lists(self):
        self.assertEqual(flatten({"tags": ["a", "b"], "m": [[1, 2], [3]]}),
                         {"tags.0": "a", "tags.1": "b", "m.0.0": 1, "m.0.1": 2, "m.1.0": 3})

    def test_top_level_list_and_empty(self):
        self.assertEqual(flatten([5, [6]]), {"0": 5, "1.0": 6})
        self.assertEqual(flatten({}), {})
        self.assertEqual(flatten([]), {})

    def test_empty_containers_kept(self):
        self.assertEqual(flatten({"a": [], "b": {"c": {}}, "d": [[]]}), {"a": [], "b.c": {}, "d.0": []})

    def test_leaf_values_and_key_order(self):
        data = {"n": None, 3: False, "s": {"t": 1.5, "u": "v"}, "w": 0}
        got = flatten(data)
        self.assertEqual(list(got.items()), [("n", None), ("3", False), ("s.t", 1.5), ("s.u", "v"), ("w", 0)])

    def test_input_not_modified(self):
        data = {"a": [{"b": 1}, {"c": [2, 3]}], "d": {}}
        before = copy.deepcopy(data)
        flatten(data)
        self.assertEqual(data, before)

    def test_deep_nesting(self):
        data = leaf = {}
        for _ in range(10000):
            leaf["k"] = {}
            leaf = leaf["k"]
        leaf["k"] = [7]
        got = flatten(data)
        self.assertEqual(got, {".".join(["k"] * 10001) + ".0": 7})

    def test_own_tests_pass(self):
        proc = subprocess.run([sys.executable, "-m", "unittest", "nested.test_flatten"], cwd="/app",
                              capture_output=True, text=True)
        self.assertEqual(proc.returncode, 0, proc.stderr[-1500:])


if __name__ == "__main__":
    unittest.main()
