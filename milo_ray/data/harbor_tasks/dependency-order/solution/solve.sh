#!/bin/bash
set -euo pipefail
cd /app
cat > deps/resolver.py <<'PY'
"""Build order of a project's modules from their dependencies."""

import heapq


class CycleError(ValueError):
    """Raised when no complete build order exists; `nodes`: the sorted unbuildable nodes."""

    def __init__(self, nodes):
        super().__init__("cycle: " + ",".join(nodes))
        self.nodes = nodes


def build_order(graph):
    """Kahn's algorithm with a min-heap, so the smallest ready name always goes next."""
    deps = {node: set(ds) for node, ds in graph.items()}
    for ds in list(deps.values()):
        for d in ds:
            deps.setdefault(d, set())
    dependents = {node: [] for node in deps}
    for node, ds in deps.items():
        for d in ds:
            dependents[d].append(node)
    missing = {node: len(ds) for node, ds in deps.items()}
    ready = [node for node, n in missing.items() if n == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        node = heapq.heappop(ready)
        order.append(node)
        for user in dependents[node]:
            missing[user] -= 1
            if missing[user] == 0:
                heapq.heappush(ready, user)
    if len(order) < len(deps):
        raise CycleError(sorted(set(deps) - set(order)))
    return order
PY
cat > deps/__main__.py <<'PY'
import json
import sys

from deps.resolver import CycleError, build_order

try:
    print("\n".join(build_order(json.load(open(sys.argv[1])))))
except CycleError as exc:
    print("cycle: " + ",".join(exc.nodes), file=sys.stderr)
    sys.exit(1)
PY
python3 -m deps project/graph.json > project/order.txt
