"""A mutation's files on their way to the worker that runs it, and back.

The request names paths on the driver's filesystem. :class:`ShippedFiles` packs them into
one content-addressed tree (:mod:`milo_ray.boundary.shipping`) that the worker reads from
its node's cache, with every mention of a driver path rewritten; the workdir is a private
copy on the worker. What the agent wrote in and beside the workdir travels back in the
outcome (``MutationOutcome.artifacts``) for the caller, on the driver, to keep where the
run keeps the workdir (:func:`keep_artifacts`).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any

from milo_ray.agents.mutators.workspace import snapshot_files
from milo_ray.agents.protocols import MutationRequest
from milo_ray.boundary.shipping import ShippedTree


@dataclass(frozen=True)
class ShippedFiles:
    """What a mutation reads from the driver's disk, as one content-addressed tree
    (:class:`~milo_ray.boundary.shipping.ShippedTree`): the parent harness directory,
    the evidence directory, the files and directories its context names (``*_dir`` /
    ``*_path`` keys) and the lineage files (``harness.py``, ``diff.patch``) its memory
    text points the agent to. ``roots`` maps a tree path to the driver path it was packed
    from; the worker rewrites every mention of one into the other."""

    tree: ShippedTree
    roots: dict[str, str] = field(default_factory=dict)

    @classmethod
    def pack(cls, request: MutationRequest) -> "ShippedFiles":
        roots: dict[str, str] = {}
        for name in ("parent_dir", "evidence_dir"):
            path = Path(getattr(request, name))
            if not path.is_dir():
                raise ValueError(f"mutation request: {name}={path} is not a directory; nothing to ship")
            roots[name] = str(path)
        for key, value in request.context.items():
            if isinstance(value, str) and (key.endswith("_dir") or key.endswith("_path")) and Path(value).exists():
                roots[f"context.{key}/{Path(value).name}"] = value  # keeps the name: agents read suffixes
        if Path(request.workdir).is_dir():  # what earlier draws of this request left there
            roots["workdir"] = str(request.workdir)
        covered = [Path(p).resolve() for p in roots.values()]
        for i, f in enumerate(snapshot_files(request.memory_markdown or "")):
            if not any(f.resolve().is_relative_to(c) for c in covered):
                roots[f"lineage/{i}/{f.name}"] = str(f)
        return cls(ShippedTree.pack(roots, origin=str(request.parent_dir)).publish(), roots)

    def unpack(self, request: MutationRequest, scratch: Path) -> MutationRequest:
        """The request as the worker sees it: the inputs read from this node's cache of
        shipped trees (shared by the node's mutations: read, never written), the workdir
        a private copy under ``scratch`` (its changes go back as artifacts, so nothing is
        written where the driver keeps the run), and every mention of a driver path
        (fields, memory text, context) rewritten."""
        into = self.tree.local_path()
        moved = {src: str(into / member) for member, src in self.roots.items() if member != "workdir"}
        moved[str(request.workdir)] = str(scratch / "work")
        if "workdir" in self.roots:  # a private copy: the cached tree is never written
            shutil.copytree(into / "workdir", scratch / "work", symlinks=True)

        def rewrite(text: str) -> str:
            for src in sorted(moved, key=len, reverse=True):  # longest first: nested paths
                text = text.replace(src, moved[src])
            return text

        context = {k: rewrite(v) if isinstance(v, str) else v for k, v in request.context.items()}
        return replace(request, parent_dir=into / "parent_dir", evidence_dir=into / "evidence_dir",
                       workdir=scratch / "work", memory_markdown=rewrite(request.memory_markdown), context=context)


def ship_files(request: MutationRequest) -> ShippedFiles | None:
    """Pack the request's files for a Ray task (None without Ray: the mutation then runs
    in this process, next to the files). Always on Ray, even on one node: the driver may
    be outside the cluster (``ray://``), and a node's disk is not the driver's."""
    import ray

    return ShippedFiles.pack(request) if ray.is_initialized() else None


# What a shipped mutation may carry back of the files its agent wrote.
ARTIFACTS_CAP_BYTES = 16 << 20


def _artifacts(workdir: Path) -> dict[str, bytes]:
    """The files an agent left in its workdir (keys ``/<path>``) and beside it
    (``<workdir><suffix>``: keys ``<suffix>``), directories not included, smallest
    first up to the cap: what the caller writes where the run keeps the workdir."""
    found = [(f"/{p.relative_to(workdir).as_posix()}", p) for p in workdir.rglob("*") if p.is_file()]
    found += [(p.name[len(workdir.name):], p) for p in workdir.parent.glob(f"{workdir.name}.*") if p.is_file()]
    out: dict[str, bytes] = {}
    total = 0
    for key, p in sorted(found, key=lambda kp: (kp[1].stat().st_size, kp[0])):
        size = p.stat().st_size
        if total + size > ARTIFACTS_CAP_BYTES:
            break
        out[key] = p.read_bytes()
        total += size
    return out


def keep_artifacts(request: MutationRequest, outcome: Any) -> Any:
    """Write a shipped mutation's artifacts into and beside the request's workdir, where
    an in-process mutation's agent writes them (the caller's machine: the driver, whose
    run keeps the workdir; a re-draw of the request finds them there and ships them
    again); the outcome without them."""
    if not outcome.artifacts:
        return outcome
    wd = Path(request.workdir)
    for key, data in outcome.artifacts.items():
        inside = key.startswith("/")
        rel = PurePosixPath(key[1:] if inside else f"{wd.name}{key}")
        if not key or rel.is_absolute() or ".." in rel.parts or (not inside and "/" in key):
            continue  # only the workdir's own files and its siblings, never a path elsewhere
        dest = (wd if inside else wd.parent) / rel
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
        except OSError:
            pass  # an artifact that cannot be kept does not change the mutation
    return replace(outcome, artifacts={})
