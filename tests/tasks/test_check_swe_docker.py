"""The task check of SWE rows under a real Docker daemon, with the base-image mounts the
README documents (``sandbox.host_mounts``): a row whose gold patch fixes the bug is ok,
a row whose gold patch does not apply is broken with that reason and scores 0 -- not the
0.5 its untouched tree scores. Skips without a daemon, except under CI=true."""

from __future__ import annotations

import json
import subprocess
import uuid

import pytest

from milo_ray.tasks.check import run_check
from milo_ray.testing.dockerd import local_host_mounts
from milo_ray.testing.swe_repo import FAIL_TO_PASS, PASS_TO_PASS, calc_repo

pytestmark = pytest.mark.slow  # an image build and containers

# A stand-in for pytest -rA (the base image lends the host's python3, which has no pytest):
# runs each listed test function and prints pytest's summary lines.
RUNNER = '''import importlib, sys
sys.path.insert(0, ".")
for tid in sys.argv[1:]:
    path, name = tid.split("::")
    try:
        getattr(importlib.import_module(path[:-3].replace("/", ".")), name)()
        print("PASSED", tid)
    except Exception as exc:
        print("FAILED", tid, "-", type(exc).__name__)
'''


@pytest.fixture(scope="module")
def swe_image(tmp_path_factory, docker_base_image):
    ctx = tmp_path_factory.mktemp("swe-image")
    repo = calc_repo(ctx / "testbed", {"tests/__init__.py": "", "run_tests.py": RUNNER})
    tag = f"milo-ray-swe-check:{uuid.uuid4().hex[:12]}"
    (ctx / "Dockerfile").write_text(f"FROM {docker_base_image}\nCOPY testbed /testbed\nWORKDIR /testbed\n")
    subprocess.run(["docker", "build", "-q", "-t", tag, str(ctx)], check=True, capture_output=True, timeout=300)
    yield tag, repo
    subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)


def test_a_gold_patch_that_does_not_apply_is_broken_and_scores_zero_under_docker(swe_image, tmp_path, ray_local):
    tag, repo = swe_image
    gold = repo.gold_patch
    row = {"repo": "o/calc", "base_commit": repo.base_commit, "problem_statement": "sub adds", "image_name": tag,
           "FAIL_TO_PASS": FAIL_TO_PASS, "PASS_TO_PASS": PASS_TO_PASS, "test_patch": repo.test_patch,
           "install_config": {"test_cmd": "python3 run_tests.py"}}
    rows = [{**row, "instance_id": "calc__good", "patch": gold},
            {**row, "instance_id": "calc__broken", "patch": gold.replace("-    return a + b", "-    return a * b")}]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = run_check(path, ["sandbox=docker", f"sandbox.host_mounts=[{','.join(local_host_mounts())}]",
                              "execution.num_cpus=2"])
    by = {v.task_id: v for v in result.verdicts}
    assert by["calc__good"].verdict == "ok", by["calc__good"].reason
    assert by["calc__good"].oracle_scores == (1.0,) and by["calc__good"].noop_score == 0.5
    assert by["calc__broken"].verdict == "broken" and "gold patch does not apply" in by["calc__broken"].reason
    assert by["calc__broken"].oracle_scores == (0.0,) and by["calc__broken"].noop_score == 0.5
