"""The directory a coding agent works in for one mutation, graft or SSR candidate.

Every LLM coding agent of the search (the deepagents mutator, an external CLI, the
orchestrator's graft, SSR's optimizer) sees the same layout, built from a
:class:`~milo_ray.agents.protocols.MutationRequest`::

    <root>/parent/        copy of the parent harness directory (harness.py + its files)
    <root>/evidence/      copy of the parent's evidence (report.md, ctrf.json, traces/...)
    <root>/memory.md      the island snapshot (MILO) or the ranked records (SSR), with
                          the paths of parent and evidence rewritten to the copies
    <root>/co_parent/     the donor's harness directory (graft only)
    <root>/out/           the only place the child may be written: out/harness.py

Inputs are copies, so an agent that scribbles on them cannot touch what the run has
stored; the child is read back from ``out/`` alone. Paths the snapshot names outside
the workspace (other lineage nodes' ``harness.py`` and ``diff.patch``) stay where the
run keeps them and are read-only to a sandboxed agent (:meth:`Workspace.external_dirs`).

An agent may see the workspace under another path than the host's (the bwrap sandbox
mounts it at ``/workspace``): :meth:`Workspace.values` renders every path as the agent
sees it, for the instruction templates of :mod:`milo_ray.agents.prompts`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from milo_ray.agents.protocols import MutationRequest
from milo_ray.boundary.nofollow import (Tree, UnsafePath, copy_tree_nofollow, read_tree_nofollow,
                                    write_tree_nofollow)
from milo_ray.harness.model import ENTRY_FILE, MAX_FILE_BYTES, Harness

OUT = "out"
# The files of a lineage node a snapshot points the agent to.
NODE_FILES = (ENTRY_FILE, "diff.patch")
# Absolute paths in a snapshot: a slash-led run of path characters.
_ABS_PATH = re.compile(r"(?<![\w./-])(/[\w.+-]+(?:/[\w.+-]+)+)")
# How many evidence files the instructions list by name (the rest: "and N more").
LISTED_FILES = 40
# What a child may hold in ``out/``: a harness is a few source files, so anything near
# these caps is a runaway agent, rejected with the cap named rather than read.
MAX_CHILD_FILES = 1_000
MAX_CHILD_BYTES = 16 << 20


def template_for(request: MutationRequest) -> str:
    """Which instructions a request calls for: ``graft`` (MILO's recombination),
    ``ssr_optimize`` (an SSR candidate from ranked records), ``mutate`` (a mutation), the
    last two as ``ssr_optimize_optimizer`` / ``mutate_optimizer`` when the artifact is an
    optimizer program (the context's ``artifact_entry`` is ``optimize``)."""
    ctx = request.context or {}
    if ctx.get("mode") == "graft":
        return "graft"
    program = ctx.get("artifact_entry") == "optimize"
    if "records" in ctx:
        return "ssr_optimize_optimizer" if program else "ssr_optimize"
    return "mutate_optimizer" if program else "mutate"


@dataclass(frozen=True)
class Workspace:
    """One prepared workspace: ``root`` on the host, ``agent_root`` as the agent sees it."""

    root: Path
    agent_root: str
    request: MutationRequest

    @property
    def out_dir(self) -> Path:
        return self.root / OUT

    @property
    def output_path(self) -> Path:
        return self.out_dir / ENTRY_FILE

    def seen(self, host_path: Path | str) -> str:
        """``host_path`` (inside the workspace) as the agent sees it."""
        # Lexically first: a path the agent replaced with a link (out/ itself) is named,
        # never resolved to where the link points.
        try:
            rel = Path(os.path.abspath(host_path)).relative_to(os.path.abspath(self.root))
        except ValueError:
            rel = Path(host_path).resolve().relative_to(self.root.resolve())
        return str(Path(self.agent_root) / rel) if str(rel) != "." else self.agent_root

    def external_dirs(self) -> list[str]:
        """Host directories of the lineage nodes the snapshot names outside the
        workspace, which a sandboxed agent must be able to read: the directory of every
        existing ``harness.py`` / ``diff.patch`` it names, outermost first, nested ones
        dropped. Other paths are never exposed: a snapshot may quote any host path a
        trajectory mentioned (``/root/.ssh``...)."""
        text = (self.root / "memory.md").read_text(encoding="utf-8") if (self.root / "memory.md").exists() else ""
        dirs: set[str] = set()
        root = str(self.root.resolve()) + os.sep
        for p in (f.resolve() for f in snapshot_files(text)):
            if not str(p).startswith(root):
                dirs.add(str(p.parent))
        kept: list[str] = []
        for d in sorted(dirs, key=len):
            if not any(d == k or d.startswith(k + os.sep) for k in kept):
                kept.append(d)
        return kept

    def values(self) -> dict[str, Any]:
        """Every value an instruction template may name, paths as the agent sees them."""
        req, ctx = self.request, dict(self.request.context or {})
        evidence = self.root / "evidence"
        files = sorted(str(p.relative_to(evidence)) for p in evidence.rglob("*") if p.is_file())
        listing = "\n".join(f"- {self.seen(evidence / f)}" for f in files[:LISTED_FILES])
        if len(files) > LISTED_FILES:
            listing += f"\n- ... and {len(files) - LISTED_FILES} more under {self.seen(evidence)}"
        values: dict[str, Any] = {
            "workspace": self.agent_root,
            "parent_harness": self.seen(self.root / "parent" / ENTRY_FILE),
            "parent_dir": self.seen(self.root / "parent"),
            "evidence_dir": self.seen(evidence),
            "evidence_files": listing or "- (no evidence files)",
            "memory_path": self.seen(self.root / "memory.md"),
            "memory": (self.root / "memory.md").read_text(encoding="utf-8"),
            "output_path": self.seen(self.output_path),
            "output_dir": self.seen(self.out_dir),
            "parent_fitness": _fitness_line(ctx),
            "seed": req.seed,
        }
        if (self.root / "co_parent").is_dir():
            values["co_parent_harness"] = self.seen(self.root / "co_parent" / ENTRY_FILE)
            values["co_parent_dir"] = self.seen(self.root / "co_parent")
        for key in ("diagnosis", "why", "dest_island", "donor_island", "island", "round", "scale"):
            values[key] = "" if ctx.get(key) is None else ctx[key]
        return values

    def child(self) -> tuple[Harness | None, str | None]:
        """The child written to ``out/`` (with its extra files), or why there is none.
        Files the agent wrote elsewhere in the workspace are named in the reason."""
        if os.path.lexists(self.out_dir) or os.path.lexists(self.output_path):
            tree, why = self.read_out()
            if why is not None:
                return None, why
            if ENTRY_FILE in tree.files:
                try:
                    name = str((self.request.context or {}).get("child_name") or "")
                    return Harness(_texts(tree), name=name or OUT), None
                except Exception as e:
                    return None, f"invalid output in {self.seen(self.out_dir)}: {e}"[:2000]
        stray = self.stray_writes()
        if stray:
            return None, (f"no child at {self.seen(self.output_path)}; the agent wrote elsewhere: "
                          + ", ".join(stray[:5]))[:2000]
        return None, f"no child: nothing was written to {self.seen(self.output_path)}"

    def read_out(self) -> tuple[Tree, str | None]:
        """What the agent left in ``out/``, read without following a link (the agent may
        have left a symlink to a host file or to ``/proc/self/environ`` there), and why it
        is not a child when it is not: a link, a special file, a hard link, a file past
        the caps, ``out`` itself a link."""
        try:
            tree = read_tree_nofollow(self.out_dir, max_files=MAX_CHILD_FILES, max_bytes=MAX_CHILD_BYTES,
                                      max_file_bytes=MAX_FILE_BYTES)
        except (UnsafePath, FileNotFoundError) as e:
            return Tree(), f"child rejected: {self.seen(self.out_dir)} is a symlink or not a directory ({e})"[:2000]
        tree.files = {k: v for k, v in tree.files.items() if "__pycache__" not in k.split("/")}
        if not tree.ok:
            return tree, (f"child rejected: {self.seen(self.out_dir)} holds what the host does not read "
                          f"(only regular files and directories are taken): {tree.why()}")[:2000]
        return tree, None

    def stray_writes(self) -> list[str]:
        """Workspace files created or changed outside ``out/`` since :func:`prepare`
        (agent's view of the paths)."""
        before = json.loads((self.root / ".inputs.json").read_text()) if (self.root / ".inputs.json").exists() else {}
        now = _stamps(self.root)
        return sorted(self.seen(self.root / k) for k, v in now.items() if before.get(k) != v)


def snapshot_files(text: str) -> list[Path]:
    """The lineage files (``harness.py``, ``diff.patch``) a snapshot names that exist
    here, as written, each once, in order of first mention: what an agent may open
    besides its workspace, and so what a mutation on another node needs shipped with it."""
    found: dict[Path, None] = {}
    for m in _ABS_PATH.finditer(text):
        p = Path(m.group(1))
        if p.name in NODE_FILES and p.is_file():
            found.setdefault(p, None)
    return list(found)


def prepare(request: MutationRequest, root: Path, *, agent_root: str | None = None) -> Workspace:
    """Build the workspace of ``request`` under ``root`` (emptied first). ``agent_root``:
    where the agent sees ``root`` (default: the host path itself)."""
    root = Path(root)
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    ws = Workspace(root, agent_root or str(root.resolve()), request)
    _copy_dir(Path(request.parent_dir), root / "parent")
    if not (root / "parent" / ENTRY_FILE).is_file():  # a parent known only by its source
        (root / "parent" / ENTRY_FILE).write_text(request.parent.source, encoding="utf-8")
    _copy_dir(Path(request.evidence_dir), root / "evidence")
    ctx = request.context or {}
    if ctx.get("co_parent_dir") or ctx.get("co_parent_source"):
        if ctx.get("co_parent_dir") and Path(ctx["co_parent_dir"]).is_dir():
            _copy_dir(Path(ctx["co_parent_dir"]), root / "co_parent")
        (root / "co_parent").mkdir(exist_ok=True)
        if not (root / "co_parent" / ENTRY_FILE).is_file():
            (root / "co_parent" / ENTRY_FILE).write_text(str(ctx.get("co_parent_source") or ""), encoding="utf-8")
    (root / OUT).mkdir()
    moves = {str(Path(request.parent_dir).resolve()): ws.seen(root / "parent"),
             str(Path(request.evidence_dir).resolve()): ws.seen(root / "evidence")}
    for raw in (str(request.parent_dir), str(request.evidence_dir)):
        moves.setdefault(raw, moves.get(str(Path(raw).resolve()), raw))
    memory = request.memory_markdown or ""
    for src in sorted(moves, key=len, reverse=True):  # longest first: nested paths
        memory = memory.replace(src, moves[src])
    (root / "memory.md").write_text(memory or "(no snapshot for this request)\n", encoding="utf-8")
    (root / ".inputs.json").write_text(json.dumps(_stamps(root)))
    return ws


def collect(ws: Workspace, workdir: Path) -> None:
    """Copy the child's files from ``out/`` to the request's workdir (where the
    mutation runner reads a written child back), read and written without following a
    link."""
    tree, why = ws.read_out()
    if why is not None:  # Workspace.child rejected it already; nothing crosses
        raise UnsafePath(str(ws.out_dir), why)
    write_tree_nofollow(Path(workdir), tree)


def _copy_dir(src: Path, dest: Path) -> None:
    # The run's own files, but possibly shipped or left by an earlier agent: links are
    # refused (skipped), never followed into the workspace.
    if src.is_dir() and not src.is_symlink():
        copy_tree_nofollow(src, dest)
    else:
        dest.mkdir(parents=True)


def _stamps(root: Path) -> dict[str, list[float]]:
    """(size, mtime) of every file outside ``out/`` (and the bookkeeping file)."""
    out: dict[str, list[float]] = {}
    for p in root.rglob("*"):
        rel = p.relative_to(root)
        if p.is_file() and rel.parts[0] not in (OUT, ".inputs.json"):
            st = p.stat()
            out[str(rel)] = [st.st_size, st.st_mtime_ns]
    return out


def _texts(tree: Tree) -> dict[str, str]:
    """The child's text files (a file that is not UTF-8 is left out, as a harness
    directory's are)."""
    out = {}
    for rel, data in tree.files.items():
        try:
            out[rel] = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
    return out


def _fitness_line(ctx: dict[str, Any]) -> str:
    acc, costs = ctx.get("parent_accuracy"), ctx.get("parent_costs") or {}
    if acc is None and not costs:
        return "(not given)"
    parts = [] if acc is None else [f"pass rate {float(acc):.3f}"]
    parts += [f"{k} {float(v):.4g}" if isinstance(v, (int, float)) else f"{k} {v}" for k, v in sorted(dict(costs).items())]
    return ", ".join(parts)
