"""Nothing assumes a shared disk: on a cluster whose nodes cannot see the driver's run and
task directories (tests/execution/hidden_cluster.py: every node, head included, has an
empty tmpfs where they live), a Harbor oracle eval, MILO and SSR run from the command line
score as on a shared disk, their rollouts and mutations run on those nodes, each node
keeps the task trees it used in its own cache, and no node writes where the driver keeps
the run. A driver outside the cluster (Ray Client, ``ray://``) works the same."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from hidden_cluster import HiddenDiskCluster

from milo_ray.benchmarks.harbor import BUNDLED_SUITE
from milo_ray.boundary.shipping import ShippedTree

REPO = Path(__file__).resolve().parents[2]
TASKS = ("leaderboard-sort", "csv-to-json", "dedupe-lines")  # each copies environment files into /app
QUIET = ["run.progress=false", "run.report=false"]
ORACLE_EVAL = ["method=eval", "executor.agent=oracle", "benchmark=harbor", "benchmark.splits={test: 1.0}",
               "method.k=1", "method.names=[minimal]", "sandbox=bwrap"]
# Lock-step rounds: free-running islands reach the orchestrator in an order that depends
# on timing, and the order changes its reassignments, so only lock-step runs are comparable.
MILO_SMALL = ["method.search_size=4", "method.val_size=3", "method.k_search=1", "method.k_val=1", "method.k_test=1",
              "method.max_rounds=2", "method.patience=1", "method.round_sync=true"]
SSR_TINY = ["method=ssr", "benchmark=surrogate_tb21", "method.scales=[0.5,1.0]", "method.b_v=[2,2]", "method.b_s=1",
            "method.b_f=1", "method.rollouts=1", "method.patience=1", "method.test_rollouts=2",
            "run.budget.executions=60"]


def _can_hide() -> bool:
    if shutil.which("unshare") is None or shutil.which("bwrap") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs none /mnt"], capture_output=True)
    return probe.returncode == 0


pytestmark = [pytest.mark.skipif(not _can_hide(), reason="needs unshare -m with tmpfs mounts (root) and bwrap"),
              pytest.mark.slow]  # cold harness processes / whole runs / a cluster: see .ci/run


@pytest.fixture(scope="module")
def cluster(request):
    # Short paths: Ray's socket names live under its temp dir.
    base = Path(tempfile.mkdtemp(prefix="hid-", dir=os.environ.get("RAY_TMPDIR") or "/tmp"))
    hidden = base / "hidden"
    for name in TASKS:
        shutil.copytree(BUNDLED_SUITE / name, hidden / "tasks" / name)
    c = HiddenDiskCluster(hidden=hidden, ray_tmp=base / "rt").start()
    c.local_ray_tmp = base / "local"  # for the shared-disk reference runs: a private Ray of their own
    c.local_ray_tmp.mkdir()
    c.references = {}
    yield c
    c.stop()
    if not request.session.testsfailed:  # else keep the nodes' logs (base/rt) to read
        shutil.rmtree(base, ignore_errors=True)


def run_cli(c: HiddenDiskCluster, args: list[str], run_dir: Path, *, address: str | None) -> dict:
    """One run from the command line. ``address``: the cluster to join (None: a private
    local Ray on this machine's disk, the shared-disk reference)."""
    if address is None:
        env = {k: v for k, v in c.env.items() if not k.startswith("RAY_AUTH")}
        env["RAY_TMPDIR"] = str(c.local_ray_tmp)
        where = ["execution=local", "execution.join_running=false", "execution.num_cpus=2"]
    else:
        env, where = c.env, ["execution=cluster", f"execution.address={address}"]
    env = {**env, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    proc = subprocess.run([sys.executable, "-m", "milo_ray.run", *args, *where, *QUIET, f"run.dir={run_dir}"],
                          cwd=c.hidden, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [r for f in sorted((run_dir / "rollouts").glob("*.parquet")) for r in pq.read_table(f).to_pylist()]
    return {"rows": rows, "manifest": json.loads((run_dir / "manifest.json").read_text())}


def scores(run: dict) -> dict[str, float]:
    return {r["cache_key"]: r["score"] for r in run["rows"]}


def reference(c: HiddenDiskCluster, name: str, args: list[str], tmp: Path) -> dict:
    """The same run on one machine's shared disk, run once per module."""
    if name not in c.references:
        c.references[name] = run_cli(c, args, tmp / f"{name}-shared-disk", address=None)
    return c.references[name]


def assert_ran_on_hidden_nodes(c: HiddenDiskCluster, run: dict) -> None:
    workers = {i[:8] for i in c.worker_ids()}
    nodes = {r["node"].rsplit(":", 1)[-1] for r in run["rows"]}
    assert nodes and nodes <= workers, (nodes, workers)
    assert all(r["error_kind"] != "infra" for r in run["rows"]), [r["error"] for r in run["rows"] if r["error"]][:3]


def assert_no_node_wrote_the_run(c: HiddenDiskCluster, run_dir: Path) -> None:
    for i in range(1 + c.workers):
        view = c.view(i, run_dir)
        written = sorted(str(p.relative_to(view)) for p in view.rglob("*")) if view.exists() else []
        assert not view.exists(), f"node {i} wrote {run_dir} in its own view of the disk: {written}"


def test_a_harbor_oracle_eval_runs_on_nodes_that_cannot_see_its_task_directories(cluster, tmp_path):
    run_dir = cluster.hidden / "runs" / "harbor-eval"
    run = run_cli(cluster, [*ORACLE_EVAL, f"benchmark.path={cluster.hidden / 'tasks'}"], run_dir,
                  address=cluster.address)
    assert run["manifest"]["status"] == "finished"
    # Every reference solution passes, as it does on a shared disk (tests/execution/test_bundled_oracle.py).
    assert sorted(r["task_id"] for r in run["rows"]) == sorted(TASKS)
    assert all(r["score"] == 1.0 and r["error_kind"] is None for r in run["rows"]), run["rows"]
    assert_ran_on_hidden_nodes(cluster, run)
    assert_no_node_wrote_the_run(cluster, run_dir)
    # Each task tree reached the nodes as content: unpacked in the caches of the nodes
    # that ran it, under its digest, and nowhere else in their view of the hidden root.
    digests = {ShippedTree.pack(cluster.hidden / "tasks" / t).digest for t in TASKS}
    cached: set[str] = set()
    for i in range(cluster.workers):
        seen = {p.name for p in cluster.view(1 + i, cluster.hidden).iterdir()}
        assert seen <= {cluster.cache_of(i).name}, seen
        if seen:
            cached |= {p.name for p in cluster.view(1 + i, cluster.cache_of(i)).iterdir()}
    assert digests <= cached


@pytest.mark.slow
def test_a_ray_client_driver_outside_the_cluster_runs_the_harbor_eval(cluster, tmp_path):
    run_dir = cluster.hidden / "runs" / "harbor-eval-client"
    run = run_cli(cluster, [*ORACLE_EVAL, f"benchmark.path={cluster.hidden / 'tasks'}"], run_dir,
                  address=cluster.client_address)
    assert all(r["score"] == 1.0 and r["error_kind"] is None for r in run["rows"]) and len(run["rows"]) == 3
    assert_ran_on_hidden_nodes(cluster, run)
    assert_no_node_wrote_the_run(cluster, run_dir)


@pytest.mark.slow
@pytest.mark.parametrize("name,args", [("milo", MILO_SMALL), ("ssr", SSR_TINY)])
def test_milo_and_ssr_on_nodes_without_the_drivers_disk_score_as_on_a_shared_disk(cluster, tmp_path, name, args):
    run_dir = cluster.hidden / "runs" / name
    run = run_cli(cluster, args, run_dir, address=cluster.address)
    shared = reference(cluster, name, args, tmp_path)
    # Mutations read their parent and evidence from the run directory: on these nodes
    # only as shipped content (the head has no CPU, so every mutation ran on a worker).
    assert scores(run) == scores(shared) and len(scores(run)) > 10
    assert run["manifest"]["status"] == shared["manifest"]["status"] == "finished"
    assert_ran_on_hidden_nodes(cluster, run)
    assert_no_node_wrote_the_run(cluster, run_dir)


@pytest.mark.slow
@pytest.mark.parametrize("name,args", [("milo", MILO_SMALL), ("ssr", SSR_TINY)])
def test_milo_and_ssr_from_a_ray_client_driver_score_as_on_a_shared_disk(cluster, tmp_path, name, args):
    # The driver packs each mutation's files (nothing on the cluster reads them by path),
    # and, as a Ray Client cannot stream a task's progress back, each mutation is relayed
    # through a task on the cluster (search/mutation.py): every child is made as on a
    # shared disk, so the runs score alike.
    run_dir = cluster.hidden / "runs" / f"{name}-client"
    run = run_cli(cluster, args, run_dir, address=cluster.client_address)
    assert scores(run) == scores(reference(cluster, name, args, tmp_path)) and len(scores(run)) > 10
    assert_ran_on_hidden_nodes(cluster, run)
    assert_no_node_wrote_the_run(cluster, run_dir)
