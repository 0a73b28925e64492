import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, "/app")
from todo import store  # noqa: E402

ITEMS = json.loads(open("/app/todo.json").read()) if os.path.exists("/app/todo.json") else []


def todo(*args):
    """Run the CLI on a private copy of the data file; (exit status, ids printed)."""
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "todo.json")
        with open(data, "w") as f:
            json.dump(ITEMS, f)
        proc = subprocess.run([sys.executable, "-m", "todo", *args], cwd="/app", capture_output=True, text=True,
                              env={**os.environ, "TODO_FILE": data})
    return proc.returncode, [int(m.group(1)) for m in re.finditer(r"^\[.\] (\d+) ", proc.stdout, re.M)]


class TestCli(unittest.TestCase):
    def test_default_list_unchanged(self):
        self.assertEqual(todo("list"), (0, [1, 2, 3, 4, 5, 6, 7]))

    def test_status_filters(self):
        self.assertEqual(todo("list", "--status", "open"), (0, [1, 2, 5, 7]))
        self.assertEqual(todo("list", "--status", "done"), (0, [3, 4, 6]))
        self.assertEqual(todo("list", "--status", "all"), (0, [1, 2, 3, 4, 5, 6, 7]))

    def test_priority_filter(self):
        self.assertEqual(todo("list", "--priority", "high"), (0, [2, 4, 7]))

    def test_sort_by_priority(self):
        self.assertEqual(todo("list", "--sort", "priority"), (0, [2, 4, 7, 1, 6, 3, 5]))

    def test_combined_options(self):
        self.assertEqual(todo("list", "--status", "open", "--sort", "priority"), (0, [2, 7, 1, 5]))
        self.assertEqual(todo("list", "--sort", "priority", "--priority", "low", "--status", "done"), (0, [3]))

    def test_invalid_choices_rejected(self):
        self.assertEqual(todo("list", "--status", "closed")[0], 2)
        self.assertEqual(todo("list", "--sort", "title")[0], 2)
        code, _ = todo("list", "--help")
        self.assertEqual(code, 0)

    def test_help_lists_options(self):
        out = subprocess.run([sys.executable, "-m", "todo", "list", "--help"], cwd="/app", capture_output=True, text=True).stdout
        for flag in ("--status", "--priority", "--sort"):
            self.assertIn(flag, out)


class TestQuery(unittest.TestCase):
    def test_query_semantics(self):
        items = json.loads(json.dumps(ITEMS))
        self.assertEqual([i["id"] for i in store.query(items)], [1, 2, 3, 4, 5, 6, 7])
        self.assertEqual([i["id"] for i in store.query(items, status="open", priority="low")], [5])
        self.assertEqual([i["id"] for i in store.query(list(reversed(items)), sort="priority")], [2, 4, 7, 1, 6, 3, 5])
        self.assertEqual(items, ITEMS)

    def test_query_rejects_bad_values(self):
        for kwargs in ({"status": "closed"}, {"sort": "title"}, {"priority": "urgent"}):
            with self.assertRaises(ValueError):
                store.query(ITEMS, **kwargs)

    def test_other_commands_unchanged(self):
        with tempfile.TemporaryDirectory() as tmp:
            data = os.path.join(tmp, "todo.json")
            shutil.copy("/app/todo.json", data)
            env = {**os.environ, "TODO_FILE": data}
            out = subprocess.run([sys.executable, "-m", "todo", "add", "Paint fence", "--priority", "high"],
                                 cwd="/app", capture_output=True, text=True, env=env).stdout
            self.assertEqual(out, "[ ] 8 (high) Paint fence\n")
            out = subprocess.run([sys.executable, "-m", "todo", "done", "8"], cwd="/app", capture_output=True,
                                 text=True, env=env).stdout
            self.assertEqual(out, "[x] 8 (high) Paint fence\n")


if __name__ == "__main__":
    unittest.main()
