"""Runs one task's hidden unittest checks and writes the verifier's outputs.

The same file (byte for byte) ships in every task of milo_ray's bundled suite, because
each task's tests/ directory is copied alone into the sandbox. One test method = one
check; reward = passed / total (partial credit), written to /logs/verifier/reward.txt,
with a CTRF report in /logs/verifier/ctrf.json. Usage: run_checks.py TEST_FILE
"""
import importlib.util, json, sys, time, unittest
from pathlib import Path

OUT = Path("/logs/verifier")


class Result(unittest.TestResult):
    def __init__(self):
        super().__init__()
        self.rows = {}  # test id -> CTRF row; a failing subtest marks its test failed

    def _row(self, test, status, err=None):
        row = {"name": test.id().split(".", 1)[-1], "status": status, "duration": 0}
        if err is not None:
            row["message"] = self._exc_info_to_string(err, test)[-2000:]
        if self.rows.get(test.id(), {}).get("status") != "failed":
            self.rows[test.id()] = row

    def addSuccess(self, test):
        self._row(test, "passed")
    def addFailure(self, test, err):
        self._row(test, "failed", err)
    addError = addFailure

    def addSubTest(self, test, subtest, err):
        if err is not None:
            self._row(test, "failed", err)


def main(path):
    start = int(time.time() * 1000)
    result = Result()
    try:
        spec = importlib.util.spec_from_file_location("test_outputs", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        unittest.defaultTestLoader.loadTestsFromModule(module).run(result)
    except Exception as exc:  # a check file that cannot load scores 0, with the reason
        result.rows["load"] = {"name": "load", "status": "failed", "message": repr(exc)}
    rows = list(result.rows.values())
    passed = sum(r["status"] == "passed" for r in rows)
    summary = {"tests": len(rows), "passed": passed, "failed": len(rows) - passed, "pending": 0,
               "skipped": 0, "other": 0, "start": start, "stop": int(time.time() * 1000)}
    OUT.mkdir(parents=True, exist_ok=True)
    report = {"results": {"tool": {"name": "unittest"}, "summary": summary, "tests": rows}}
    (OUT / "ctrf.json").write_text(json.dumps(report, indent=1))
    (OUT / "reward.txt").write_text(f"{round(passed / len(rows), 4) if rows else 0.0}\n")
    print(f"{passed}/{len(rows)} checks passed")


if __name__ == "__main__":
    main(sys.argv[1])
