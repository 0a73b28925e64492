"""The search agents of this process, per run session: a mutation's agent (an LLM agent
with its client and rate limiter, an offline agent with its memory of tried edits) is
built once per (session, spec) and reused by every mutation of that session; agents a run
builds once for itself on the driver (judge, embedder, orchestrator) are built fresh.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

# Agents per (scope, spec). A scope is one session of one run (``RunContext.session``):
# agents keep state between calls (an LLM client, an offline agent's memory of tried
# edits), and a run must never inherit another run's agent, nor a resumed session the
# dead one's. Long-lived worker processes serve many runs, so only the newest scopes
# are kept.
_AGENTS: "OrderedDict[str | None, dict[str, Any]]" = OrderedDict()
_BUILD_LOCKS: dict[tuple[str | None, str], threading.Lock] = {}
_REGISTRY_LOCK = threading.Lock()  # guards the registry only, never held while building
MAX_SCOPES = 4


def _spec_key(spec: Any) -> str | None:
    return json.dumps(spec, sort_keys=True, default=str) if isinstance(spec, dict) else None


def build_agent(spec: Any) -> Any:
    """A fresh agent from a ``_target_`` spec (an object is used as is): for agents a
    run builds once for itself on the driver (judge, embedder, orchestrator)."""
    if _spec_key(spec) is None:
        if spec is None:
            raise ValueError("agent spec is missing (expected a `_target_` dict under backend.agents)")
        return spec
    return _build(spec)


def agent_for(spec: Any, scope: str | None = None) -> Any:
    """The agent of ``spec`` for ``scope`` in this process: a ``_target_`` dict is built
    once and reused by every mutation of that scope; an already built object is used as
    is. Building holds only this spec's lock, so a constructor that hangs blocks nobody
    else."""
    key = _spec_key(spec)
    if key is None:
        return build_agent(spec)
    with _REGISTRY_LOCK:
        agent = _AGENTS.get(scope, {}).get(key)
        if agent is not None:
            _AGENTS.move_to_end(scope)
            return agent
        lock = _BUILD_LOCKS.setdefault((scope, key), threading.Lock())
    with lock:
        with _REGISTRY_LOCK:
            agent = _AGENTS.get(scope, {}).get(key)
        if agent is None:
            agent = _build(spec)
            with _REGISTRY_LOCK:
                _AGENTS.setdefault(scope, {})[key] = agent
                _AGENTS.move_to_end(scope)
                while len(_AGENTS) > MAX_SCOPES:
                    old, _ = _AGENTS.popitem(last=False)
                    for k in [k for k in _BUILD_LOCKS if k[0] == old]:
                        del _BUILD_LOCKS[k]
        return agent


def _build(spec: dict[str, Any]) -> Any:
    if "_target_" not in spec:
        raise ValueError(f"agent spec has no _target_ (keys: {sorted(spec)}); see conf/backend/*.yaml")
    from hydra.utils import instantiate

    # A pool spec may carry a display ``name`` its class does not take.
    kwargs = {k: v for k, v in spec.items() if k != "name"} if _drops_name(spec) else spec
    return instantiate(kwargs, _convert_="all")


def _drops_name(spec: dict[str, Any]) -> bool:
    if "name" not in spec:
        return False
    import inspect

    from hydra.utils import get_class

    try:
        params = inspect.signature(get_class(spec["_target_"])).parameters
    except Exception:
        return False
    return "name" not in params and not any(p.kind is p.VAR_KEYWORD for p in params.values())


def forget_agent(spec: Any, scope: str | None = None) -> None:
    """Drop a cached agent (after a timeout its state is unknown). Never waits for a
    constructor in progress."""
    key = _spec_key(spec)
    if key is not None:
        with _REGISTRY_LOCK:
            _AGENTS.get(scope, {}).pop(key, None)
