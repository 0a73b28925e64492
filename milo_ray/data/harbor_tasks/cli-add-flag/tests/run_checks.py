"""Runs a task's hidden unittest checks: one test method = one check; reward = passed / total
in /logs/verifier/reward.txt, a CTRF report in /logs/verifier/ctrf.json. The same file ships in
every task of milo_ray's bundled suite (each task's tests/ is copied alone into the sandbox)."""
import importlib.util, json, signal, sys, time, unittest
from pathlib import Path

OUT = Path("/logs/verifier")
CHECK_SECONDS = 10  # a hanging check fails alone instead of costing every check the verifier timeout


def _too_slow(signum, frame):
    raise TimeoutError(f"check took longer than {CHECK_SECONDS} s")


class Result(unittest.TestResult):
    def __init__(self):
        super().__init__()
        self.rows = {}  # test id -> CTRF row; a failing subtest marks its test failed
    def _row(self, test, status, err=None):
        row = {"name": test.id().split(".", 1)[-1], "status": status, "duration": 0,
               **({"message": self._exc_info_to_string(err, test)[-2000:]} if err else {})}
        if self.rows.get(test.id(), {}).get("status") != "failed":
            self.rows[test.id()] = row
    def startTest(self, test):
        super().startTest(test)
        signal.alarm(CHECK_SECONDS)
    def stopTest(self, test):
        signal.alarm(0)
        super().stopTest(test)
    def addSuccess(self, test):
        self._row(test, "passed")
    def addFailure(self, test, err):
        self._row(test, "failed", err)
    addError = addFailure
    def addSubTest(self, test, subtest, err):
        err is not None and self._row(test, "failed", err)


def main(path):
    start, result = int(time.time() * 1000), Result()
    signal.signal(signal.SIGALRM, _too_slow)
    try:
        module = importlib.util.module_from_spec(spec := importlib.util.spec_from_file_location("t", path))
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


main(sys.argv[1])
