"""The check every run makes before it writes anything: the tasks the configured sandbox
cannot run (:func:`milo_ray.config.validate.check_tasks_runnable`) and, under
``sandbox=docker``, the tasks whose image is not on the Docker host
(:func:`milo_ray.tasks.static.image_problems`), named together in one message -- every
task with a problem, not the first. ``run.skip_unrunnable_tasks=true`` skips them with
a warning instead.
"""

from __future__ import annotations

import sys
from typing import Any

from milo_ray.config.errors import UserError
from milo_ray.config.validate import check_tasks_runnable
from milo_ray.tasks.static import image_problems, is_docker


def _sandbox_factory(executor_node: Any) -> Any | None:
    node = executor_node.get("sandbox") if hasattr(executor_node, "get") else None
    if node is None:
        return None
    from milo_ray.execution.agent_executor import build_factory

    try:
        return build_factory(node)
    except (ValueError, TypeError) as exc:
        raise UserError(f"sandbox: {exc}") from None


def check_runnable(executor_spec: Any, executor_node: Any, tasks: Any, *, skip: bool = False) -> dict[str, str]:
    """{task id: why} of the tasks this run cannot run; raises ``UserError`` listing all of
    them unless ``skip`` (then the caller drops them with a warning)."""
    unique = list({t.task_id: t for t in tasks}.values())
    problems = check_tasks_runnable(executor_spec, executor_node, unique, skip=True)
    real = [t for t in unique if t.format is not None and t.task_id not in problems]
    if real:
        factory = _sandbox_factory(executor_node)
        if factory is not None and is_docker(factory):
            problems.update(image_problems(factory, real))
    if problems and not skip:
        order = {t.task_id: i for i, t in enumerate(unique)}
        lines = [problems[k] for k in sorted(problems, key=lambda k: order.get(k, len(order)))]
        raise UserError(f"executor: {len(problems)} of {len(unique)} tasks cannot run here (fix them, choose another "
                        "sandbox, or set run.skip_unrunnable_tasks=true to skip them with a warning; "
                        "python -m milo_ray.tasks check PATH gives a verdict per task):\n" + "\n".join(lines))
    return problems


def skip_tasks(benchmark: Any, skipped: dict[str, str]) -> None:
    """Drop the tasks ``run.skip_unrunnable_tasks`` let the run skip from every split."""
    drop = getattr(benchmark, "drop_tasks", None)
    if not callable(drop):
        raise UserError(f"run.skip_unrunnable_tasks=true: benchmark {getattr(benchmark, 'name', '?')} cannot drop "
                        f"tasks; fix or remove them: {'; '.join(skipped.values())}")
    for task_id, why in skipped.items():
        print(f"warning: skipping task {task_id} (run.skip_unrunnable_tasks=true): {why}", file=sys.stderr)
    drop(set(skipped))
    if not any(benchmark.splits().values()):
        raise UserError("run.skip_unrunnable_tasks=true: every task was skipped; nothing left to run")
