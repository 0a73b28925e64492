"""What can be known about a task without running it: whether the configured sandbox can
run it, whether its image is on the Docker host, whether it has a reference solution, and
whether its verifier script has a fetch step (an installer, or a curl/wget whose download
it keeps: :mod:`milo_ray.benchmarks.network_evidence`). That is a note beside the verdict,
never the verdict itself: only the run's output can show a fetch step failing, and a curl
of a blocked URL that a test expects to fail is not a fetch step.

Images: a run does not pull. A task's prebuilt image (``docker_image``), or the image its
Dockerfile starts FROM, must be on the Docker host before the run: a pull inside a
rollout would count against the rollout's time and, offline, fail only after the
scheduler's retries. ``sandbox.base_image_override`` replaces the FROM image, so then
that one must be present.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any, Iterable

from milo_ray.benchmarks.network_evidence import fetch_steps
from milo_ray.core.tasks import Task
from milo_ray.tasks.verdicts import NEEDS_DOCKER, UNRUNNABLE, StaticFindings

_INSPECT_TIMEOUT_S = 30.0


def is_docker(factory: Any) -> bool:
    return getattr(factory, "name", None) == "docker" and hasattr(factory, "docker")


def required_image(factory: Any, task: Task) -> str | None:
    """The image ``task`` needs on the Docker host under ``factory`` (None: none it can
    check -- a Dockerfile starting FROM scratch, or a task without a format)."""
    if task.format is None:
        return None
    spec = task.format.sandbox_spec(task)
    if spec.docker_image:
        return spec.docker_image
    if spec.build_context is None:
        return None
    base = getattr(factory, "base_image_override", None) or task.metadata.get("base_image")
    return None if not base or base == "scratch" else str(base)


class ImageProbe:
    """Asks the Docker host once per image whether it holds it (``docker image inspect``)."""

    def __init__(self, factory: Any) -> None:
        self.docker = tuple(factory.docker)
        self._seen: dict[str, str | None] = {}

    def missing(self, image: str) -> str | None:
        """Why ``image`` is not usable on the host, or None when it is there."""
        if image not in self._seen:
            self._seen[image] = self._inspect(image)
        return self._seen[image]

    def _inspect(self, image: str) -> str | None:
        try:
            done = subprocess.run([*self.docker, "image", "inspect", "--format", "{{.Id}}", image],
                                  capture_output=True, text=True, timeout=_INSPECT_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"could not ask the Docker host for image {image} ({exc})"
        if done.returncode == 0:
            return None
        return f"image {image} is not on the Docker host (docker pull {image} before the run, or build it)"


def image_problems(factory: Any, tasks: Iterable[Task]) -> dict[str, str]:
    """task id -> why its image is missing, for every task under a Docker ``factory``
    whose image is not on the host (empty for any other sandbox)."""
    if not is_docker(factory):
        return {}
    probe = ImageProbe(factory)
    out = {}
    for task in tasks:
        image = required_image(factory, task)
        why = probe.missing(image) if image else None
        if why:
            if image != task.metadata.get("docker_image") and image == getattr(factory, "base_image_override", None):
                why += " (it is sandbox.base_image_override)"
            elif image != task.metadata.get("docker_image"):
                why += "; its Dockerfile starts FROM it (offline: set sandbox.base_image_override to a local image)"
            out[task.task_id] = f"task {task.task_id}: {why}"
    return out


def verifier_text(task: Task) -> str:
    """The verifier's commands as far as they can be read: a Harbor task's ``tests/*.sh``,
    a SWE row's test command."""
    m = task.metadata
    if m.get("format") == "swe":
        return str(m.get("test_cmd") or "")
    root = _task_root(task)
    if root is None:
        return ""
    return "\n".join(p.read_text(errors="replace") for p in sorted((root / "tests").glob("*.sh")) if p.is_file())


def _task_root(task: Task) -> Path | None:
    if task.metadata.get("format") != "harbor":
        return None
    from milo_ray.benchmarks.harbor import task_root

    return task_root(task)


def network_hint(task: Task, allow_internet: bool) -> str:
    """The verifier script's first fetch step, as a note ('' when it has none, or the task
    has internet access)."""
    if allow_internet:
        return ""
    for _, _, line in fetch_steps(verifier_text(task)):
        snippet = line if len(line) <= 80 else line[:77] + "..."
        return f"the verifier runs `{snippet}` and the task has no internet access"
    return ""


def static_findings(factory: Any, tasks: list[Task], *, needs_solution: bool = True) -> dict[str, StaticFindings]:
    """Findings for each task under the sandbox ``factory``."""
    images = image_problems(factory, tasks)
    out = {}
    for task in tasks:
        spec = task.format.sandbox_spec(task)
        blocker = None
        why = factory.unsupported(spec)
        if why:
            kind = NEEDS_DOCKER if spec.needs_docker and not is_docker(factory) else UNRUNNABLE
            blocker = (kind, why)
        elif task.task_id in images:
            blocker = (UNRUNNABLE, images[task.task_id])
        elif needs_solution and not task.metadata.get("has_solution", True):
            # A format names where its reference solution would be (a PaperBench paper's
            # reference_submission/); Harbor's and SWE's are the default.
            where = task.metadata.get("solution_layout") or "solution/solve.sh, or the row's patch"
            blocker = (UNRUNNABLE, f"task {task.task_id}: no reference solution ({where}), so nothing can show "
                                   "that it is solvable")
        out[task.task_id] = StaticFindings(blocker=blocker, network_hint=network_hint(task, spec.allow_internet))
    return out
