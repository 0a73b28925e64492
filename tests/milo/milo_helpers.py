"""Small builders shared by the MILO tests (plain data, no Ray)."""

from __future__ import annotations

from milo_ray.milo.lineage import LineageNode


def node(node_id: str, *, island: int = 0, parent: str | None = None, acc: float | None = 0.5,
         tokens: float = 1e5, seconds: float = 600.0, behavior: dict | None = None, admitted: bool = True,
         origin: str | None = None, mutation: str = "", reason: str = "", caps=(2e7, 7200.0), **kw) -> dict:
    fit = None if acc is None else [acc, 1 - tokens / caps[0], 1 - seconds / caps[1]]
    return LineageNode(
        node_id=node_id, harness_id=kw.pop("harness_id", f"h{node_id}"), island=island, round=kw.pop("round", 0),
        origin=origin or ("seed" if parent is None else "mutation"), parent=parent, accuracy=acc,
        costs={} if acc is None else {"output_tokens": tokens, "seconds": seconds},
        fitness=fit, behavior=behavior if behavior is not None else ({} if acc is None else {"t1": acc, "t2": acc}),
        admitted=admitted, mutation=mutation, verdict_reason=reason or ("admitted" if admitted else "rejected"), **kw,
    ).to_dict()


def fitness(acc: float, tokens: float = 1e5, seconds: float = 600.0, caps=(2e7, 7200.0)) -> list[float]:
    return [acc, 1 - tokens / caps[0], 1 - seconds / caps[1]]
