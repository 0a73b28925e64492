"""Files ship as content: a packed tree is named by its content, put into the object store
once per driver, unpacked once per node into a cache that concurrent users share safely,
and a mutation's inputs reach its worker that way (never by the driver's path), with
nothing written where the driver keeps the run."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from milo_ray.agents.protocols import MutationRequest, MutationResult
from milo_ray.boundary import shipping
from milo_ray.boundary.shipping import ShippedTree, ShippingError, publish_all
from milo_ray.harness.model import ENTRY_FILE, Harness
from milo_ray.search.mutation import ShippedFiles, ValidationOptions, _mutation_steps, keep_artifacts, run_mutation


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Each test gets an empty node cache and forgets what this process unpacked."""
    monkeypatch.setenv(shipping.CACHE_ENV, str(tmp_path / "node-cache"))
    monkeypatch.setattr(shipping, "_unpacked", {})
    return tmp_path / "node-cache"


def tree(root: Path) -> Path:
    (root / "environment" / "src").mkdir(parents=True)
    (root / "environment" / "src" / "m.py").write_text("x = 1\n")
    (root / "tests").mkdir()
    (root / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    (root / "tests" / "test.sh").chmod(0o755)
    (root / "environment" / "link.py").symlink_to("src/m.py")
    return root


def test_equal_content_packs_to_the_same_digest_and_any_change_to_another(tmp_path):
    a = tree(tmp_path / "a")
    first, again = ShippedTree.pack(a), ShippedTree.pack(a)
    assert first.digest == again.digest and first == again and first.size > 0
    (a / "tests" / "test.sh").write_text("#!/bin/bash\necho 0 > /logs/verifier/reward.txt\n")
    assert ShippedTree.pack(a).digest != first.digest
    os.utime(a / "environment" / "src" / "m.py", (1, 1))  # a file's time is part of what a task ships
    assert ShippedTree.pack(a).digest != first.digest


def test_an_unpacked_tree_has_the_files_modes_and_links_of_the_original(tmp_path):
    src = tree(tmp_path / "task")
    got = ShippedTree.pack(src).local_path()
    assert got != src and got.parent == Path(os.environ[shipping.CACHE_ENV])
    assert (got / "environment" / "src" / "m.py").read_text() == "x = 1\n"
    assert os.access(got / "tests" / "test.sh", os.X_OK)
    assert (got / "environment" / "link.py").is_symlink() and (got / "environment" / "link.py").read_text() == "x = 1\n"


def test_a_tree_is_unpacked_once_per_node_and_later_users_reuse_it(tmp_path, monkeypatch):
    t = ShippedTree.pack(tree(tmp_path / "task"))
    first = t.local_path()
    # Another process of the node (this process with its memory cleared) holding only a
    # reference whose bytes it cannot fetch still finds the unpacked directory.
    monkeypatch.setattr(shipping, "_unpacked", {})
    unfetchable = ShippedTree(t.digest, t.size, t.origin, ref=object())
    assert unfetchable.local_path() == first
    # Without the cache, the same reference must fetch -- and cannot.
    shutil.rmtree(first)
    monkeypatch.setattr(shipping, "_unpacked", {})
    with pytest.raises(ShippingError, match="could not be fetched"):
        unfetchable.local_path()


def test_bytes_that_do_not_match_the_digest_are_refused(tmp_path):
    t = ShippedTree.pack(tree(tmp_path / "task"))
    forged = pickle.loads(pickle.dumps(ShippedTree(t.digest, t.size, t.origin,
                                                   data=ShippedTree.pack(tmp_path / "task" / "tests")._data)))
    with pytest.raises(ShippingError, match="do not match its digest"):
        forged.local_path()


def _materialize(blob: bytes, cache: str, out: multiprocessing.Queue) -> None:
    os.environ[shipping.CACHE_ENV] = cache
    t = pickle.loads(blob)
    path = t.local_path()
    out.put((str(path), sorted(str(p.relative_to(path)) for p in path.rglob("*"))))


def test_concurrent_processes_of_a_node_all_get_one_complete_tree(tmp_path, private_cache):
    src = tree(tmp_path / "task")
    for i in range(200):  # enough files that unpacking takes a while
        (src / "environment" / f"f{i}.txt").write_text(str(i) * 100)
    t = ShippedTree.pack(src)
    want = sorted(str(p.relative_to(src)) for p in src.rglob("*"))
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_materialize, args=(pickle.dumps(t), str(private_cache), out)) for _ in range(6)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
    assert {r[0] for r in results} == {str(private_cache / t.digest)}
    assert all(r[1] == want for r in results)
    assert [p.name for p in private_cache.iterdir()] == [t.digest]  # no staging directory left behind


def test_a_published_tree_travels_as_a_reference_put_once_per_driver(tmp_path, ray_local):
    import ray

    src = tree(tmp_path / "task")
    (src / "environment" / "big.bin").write_bytes(os.urandom(200_000))
    a, b = ShippedTree.pack(src), ShippedTree.pack(src)
    inline = len(pickle.dumps(a))
    assert inline > a.size  # unpublished: the bytes go with it
    publish_all({"files": a, "more": [b]})
    assert a.published and b.published and a._ref == b._ref  # one object for one content
    assert len(pickle.dumps(a)) < 2_000 < inline

    @ray.remote(num_cpus=0)
    def read_on_a_worker(t: ShippedTree) -> tuple[str, bool]:
        shipping._unpacked.clear()  # a fresh look, as on another node
        p = t.local_path()
        return (p / "environment" / "src" / "m.py").read_text(), t._data is None

    text, by_reference = ray.get(read_on_a_worker.remote(a))
    assert text == "x = 1\n" and by_reference


# --------------------------------------------------------------------------- mutations

class _LineageReader:
    """Reads the parent, the evidence and every lineage file the memory names; writes a
    transcript beside its workdir, as the CLI and deepagents mutators do."""

    name = "lineage-reader"

    def mutate(self, request: MutationRequest) -> MutationResult:
        import re

        wd = Path(request.workdir)
        wd.joinpath("scratch.txt").write_text("agent notes")
        (wd.parent / f"{wd.name}.transcript.json").write_text('{"messages": []}')
        read = [Path(p).read_text() for p in re.findall(r"(/\S+/(?:harness\.py|diff\.patch))", request.memory_markdown)]
        seen = "".join(f"# {line}\n" for text in read for line in text.splitlines() if line.startswith("#"))
        body = Path(request.parent_dir, ENTRY_FILE).read_text() + seen
        return MutationResult(Harness({ENTRY_FILE: body + f"# workdir {wd}\n"}), report="read the lineage")


def test_a_shipped_mutation_reads_its_lineage_from_the_cache_and_writes_nothing_into_the_run(tmp_path):
    run = tmp_path / "run"
    parent = Harness.from_source("def build_agent(model, backend):\n    return None\n", name="p")
    parent_dir = parent.write_to(run / "lineage" / "n1")
    sibling = run / "lineage" / "n0"
    sibling.mkdir(parents=True)
    (sibling / "harness.py").write_text("# sibling harness\n")
    (sibling / "diff.patch").write_text("# sibling diff\n")
    evidence = run / "evidence"
    evidence.mkdir()
    (evidence / "report.md").write_text("all failed")
    workdir = run / "workspace" / "mutations" / "round-1"
    req = MutationRequest(parent=parent, parent_dir=parent_dir, evidence_dir=evidence,
                          memory_markdown=f"- n0: {sibling}/harness.py, diff {sibling}/diff.patch\n",
                          workdir=workdir, seed=0)
    shipped = ShippedFiles.pack(req)
    assert any(m.startswith("lineage/") for m in shipped.roots)
    moved = tmp_path / "elsewhere"
    run.rename(moved)  # the worker's view: the driver's run directory does not exist
    try:
        # The body a Ray task runs on the worker.
        steps = list(_mutation_steps(_LineageReader(), req, time_cap_s=30, validation=ValidationOptions(enabled=False),
                                     call="mutate", shipped=shipped))
        assert not run.exists()  # the worker created nothing where the driver keeps the run
    finally:
        moved.rename(run)
    out = steps[-1]
    assert out.ok, out.reason
    assert "# sibling harness" in out.child.source and "# sibling diff" in out.child.source
    worker_wd = out.child.source.rsplit("# workdir ", 1)[1].strip()
    assert not worker_wd.startswith(str(run))  # a private workdir, not the run's
    assert set(out.artifacts) == {".transcript.json", "/scratch.txt"}  # carried back, not left on the worker
    kept = keep_artifacts(req, out)  # the caller, on the driver, keeps them in and beside the workdir
    assert (workdir.parent / "round-1.transcript.json").read_text() == '{"messages": []}'
    assert (workdir / "scratch.txt").read_text() == "agent notes" and kept.artifacts == {}
    # A re-draw of the request ships what the first draw left in the workdir.
    again = ShippedFiles.pack(req)
    assert "workdir" in again.roots and again.tree.digest != shipped.tree.digest
    assert keep_artifacts(req, replace(out, artifacts={"/../escape.txt": b"x", "/../../x": b"y"})).artifacts == {}
    assert not (run / "workspace" / "mutations" / "escape.txt").exists()


def test_a_mutation_whose_files_cannot_arrive_is_a_rejected_child_not_a_crash(tmp_path, monkeypatch):
    req = MutationRequest(parent=Harness.from_source("x = 1\n"), parent_dir=Harness.from_source("x = 1\n").write_to(
        tmp_path / "p"), evidence_dir=tmp_path / "p", memory_markdown="", workdir=tmp_path / "w", seed=0)
    shipped = ShippedFiles.pack(req)
    broken = ShippedFiles(ShippedTree(shipped.tree.digest, shipped.tree.size, "x", ref=object()), shipped.roots)
    out = run_mutation(_LineageReader(), req, time_cap_s=30, shipped=broken)
    assert out.child is None and "did not arrive" in out.error
