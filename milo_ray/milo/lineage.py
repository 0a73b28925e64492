"""MILO's hierarchical lineage memory (papers/000 §4.1.1): the nodes and edges of
each island's append-only tree, and the cross-island co-parent edges that make the
whole memory a DAG.

Owns :class:`LineageNode` (a harness's evaluation label l_H and its admission
verdict), :class:`Edge` (the edit label l_E: diff, Δacc, Δcost) and
:class:`Lineage` (one island's tree). Rejected children stay in the tree forever;
only Speciate removes nodes, by moving a whole subtree to a new island.

Nodes are plain JSON-able data so they travel as ``events`` payloads: the run store
is the source of truth and a lineage is rebuilt by replaying ``milo.node`` events
(see :mod:`milo_ray.milo.state`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Iterator

# Cost axes in fitness order (F1, F2): mean output tokens and mean agent seconds per task.
COST_AXES: tuple[str, ...] = ("output_tokens", "seconds")
ORIGINS: tuple[str, ...] = ("seed", "mutation", "graft", "speciate")


@dataclass
class LineageNode:
    """One harness in an island's tree.

    ``node_id`` is unique in the run and stable across resume (``<island>-<round>``
    for mutation children, ``s<island>-<seed name>`` for seeds, ``...-g<k>`` for graft
    children). ``harness_id`` is the content hash; a failed mutation has no harness
    and gets ``harness_id=""``. ``accuracy``/``costs``/``behavior``/``fitness`` are
    measured on B_search of curriculum version ``search_version`` and are None when
    the child was never evaluated (mutator failure, invalid or duplicate child).
    ``mutation`` is the mutator's one-line change label.
    """

    node_id: str
    harness_id: str
    island: int
    round: int
    origin: str
    parent: str | None = None
    co_parent: str | None = None
    mutator: str | None = None
    mutation: str = ""
    name: str = ""
    accuracy: float | None = None
    costs: dict[str, float] = field(default_factory=dict)
    fitness: list[float] | None = None
    behavior: dict[str, float] = field(default_factory=dict)
    admitted: bool = False
    verdict_reason: str = ""
    delta_hv: float | None = None
    val_accuracy: float | None = None
    harness_path: str | None = None
    diff_path: str | None = None
    evidence_path: str | None = None
    diff_added: int = 0
    diff_deleted: int = 0
    validation_error: str | None = None
    search_version: int = 0
    source_ref: str | None = None
    # A graft's co-parent lives on another island: its accuracy and costs when the
    # graft was made label the cross-island edge (E_x).
    co_parent_label: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.origin not in ORIGINS:
            raise ValueError(f"LineageNode.origin={self.origin!r}; expected one of {ORIGINS}")

    @property
    def evaluated(self) -> bool:
        return self.accuracy is not None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "LineageNode":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass(frozen=True)
class Edge:
    """The label l_E of parent -> child: edit size and the gains it produced.

    Δacc = Acc(child) − Acc(parent); Δcost = Cost(parent) − Cost(child) per axis
    (positive = the child is cheaper), following papers/000 Eq. 3. ``kind`` is
    ``"tree"`` for the parent edge and ``"graft"`` for a cross-island co-parent edge.
    """

    parent: str
    child: str
    kind: str
    diff_added: int
    diff_deleted: int
    diff_path: str | None
    delta_acc: float | None
    delta_cost: dict[str, float]


class Lineage:
    """One island's append-only tree L_j (insertion-ordered)."""

    def __init__(self, island: int) -> None:
        self.island = int(island)
        self._nodes: dict[str, LineageNode] = {}

    # --- reading -------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._nodes

    def __iter__(self) -> Iterator[LineageNode]:
        return iter(self._nodes.values())

    def node(self, node_id: str) -> LineageNode:
        try:
            return self._nodes[node_id]
        except KeyError:
            raise KeyError(f"island {self.island} has no node {node_id!r}") from None

    def nodes(self) -> list[LineageNode]:
        return list(self._nodes.values())

    def roots(self) -> list[LineageNode]:
        return [n for n in self._nodes.values() if n.parent is None or n.parent not in self._nodes]

    def children(self, node_id: str) -> list[LineageNode]:
        return [n for n in self._nodes.values() if n.parent == node_id]

    def subtree(self, node_id: str) -> list[LineageNode]:
        """``node_id`` and all its descendants, in insertion order."""
        keep = {node_id}
        for n in self._nodes.values():  # insertion order: parents precede children
            if n.parent in keep:
                keep.add(n.node_id)
        return [n for n in self._nodes.values() if n.node_id in keep]

    def find(self, key: str) -> LineageNode | None:
        """A node by node id, or the first node with that harness id."""
        if key in self._nodes:
            return self._nodes[key]
        for n in self._nodes.values():
            if n.harness_id and n.harness_id == key:
                return n
        return None

    def depth(self, node_id: str) -> int:
        d, n = 0, self._nodes[node_id]
        while n.parent is not None and n.parent in self._nodes:
            d += 1
            n = self._nodes[n.parent]
        return d

    def admitted(self) -> list[LineageNode]:
        return [n for n in self._nodes.values() if n.admitted]

    def edge(self, node_id: str) -> Edge | None:
        """The incoming tree edge of a node (None for a root)."""
        n = self._nodes[node_id]
        if n.parent is None or n.parent not in self._nodes:
            return None
        p = self._nodes[n.parent]
        return _edge(p, n, "tree")

    def co_parent_edge(self, node_id: str) -> Edge | None:
        """The cross-island edge h_co -> h of a graft child (None for other nodes)."""
        n = self._nodes[node_id]
        if not n.co_parent or not n.co_parent_label:
            return None
        label = n.co_parent_label
        co = LineageNode(node_id=n.co_parent, harness_id="", island=-1, round=0, origin="seed",
                         accuracy=label.get("accuracy"), costs=dict(label.get("costs") or {}),
                         search_version=int(label.get("search_version", n.search_version)))
        return graft_edge(co, n)

    def edges(self) -> list[Edge]:
        return [e for e in (self.edge(n.node_id) for n in self._nodes.values()) if e is not None]

    # --- writing (append-only, plus the two orchestrator restructurings) ------------
    def add(self, node: LineageNode) -> None:
        if node.node_id in self._nodes:
            raise ValueError(f"island {self.island}: node {node.node_id!r} already exists (the memory is append-only)")
        node.island = self.island
        self._nodes[node.node_id] = node

    def update(self, node_id: str, **changes: Any) -> LineageNode:
        """Relabel a node (held-out score, curriculum re-fit); the tree shape never changes."""
        n = self.node(node_id)
        for k, v in changes.items():
            if not hasattr(n, k):
                raise ValueError(f"LineageNode has no field {k!r}")
            setattr(n, k, v)
        return n

    def detach_subtree(self, node_id: str) -> list[LineageNode]:
        """Remove and return the subtree rooted at ``node_id`` (Speciate)."""
        moved = self.subtree(node_id)
        for n in moved:
            del self._nodes[n.node_id]
        return moved


def _edge(parent: LineageNode, child: LineageNode, kind: str) -> Edge:
    dacc = None
    dcost: dict[str, float] = {}
    # Gains compare like with like: both measured on the same B_search (a curriculum
    # change re-fits admitted nodes only, so a rejected node keeps older numbers).
    if parent.evaluated and child.evaluated and parent.search_version == child.search_version:
        dacc = float(child.accuracy) - float(parent.accuracy)  # type: ignore[arg-type]
        dcost = {a: float(parent.costs.get(a, 0.0)) - float(child.costs.get(a, 0.0)) for a in COST_AXES}
    return Edge(
        parent=parent.node_id,
        child=child.node_id,
        kind=kind,
        diff_added=child.diff_added,
        diff_deleted=child.diff_deleted,
        diff_path=child.diff_path,
        delta_acc=dacc,
        delta_cost=dcost,
    )


def graft_edge(co_parent: LineageNode, child: LineageNode) -> Edge:
    """The cross-island co-parent edge h_co -> h (set E_x of §4.1.1)."""
    return _edge(co_parent, child, "graft")
