"""An executor whose every rollout fails as infrastructure: what a cluster produces whose
nodes cannot reach a task's files or a sandbox host (tests/entry/test_infra_exit.py)."""

from __future__ import annotations

from typing import Any


class AlwaysInfra:
    def __init__(self, model: Any = None, **_: Any) -> None:
        self.model_id = getattr(model, "id", None) or (model or {}).get("id", "offline")

    def execute(self, harness: Any, task: Any, rollout_idx: int, seed: int) -> Any:
        raise RuntimeError(f"task {task.task_id}: the node cannot reach the task's files (test executor)")
