"""The rollout executor's side of an episodic task format (a task that is a live world,
:class:`~milo_ray.core.tasks.TaskEpisode`: an ARE scenario): starting the world before the
agent acts, and reading its verdict once the agent's processes are dead.

* The world's tool socket is made in the harness process's own gateway directory (the
  one directory of the host its sandbox is shown, beside its grant's socket), so no other
  rollout's sandbox can reach it; for the oracle, which has no sandbox to show it to, in a
  private directory of the rollout.
* The grader role, when the format's judge asks for it, is this rollout's metered grader,
  made when the world starts (its judge may check during the episode, not only after) and
  recorded with the verdict.
* A world that does not start is an infrastructure failure of the rollout (retried); a
  world that starts and fails later is the task's failure (its verdict's ``error``).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path
from typing import Any

from milo_ray.core.rollouts import InfraFailure
from milo_ray.core.tasks import Task, Verdict


def is_episodic(fmt: Any) -> bool:
    return bool(getattr(fmt, "episodic", False))


class RunningEpisode:
    """A started world with the grader it was given (None: its judge needs none)."""

    def __init__(self, episode: Any, grader: Any, private_dir: Path | None) -> None:
        self.episode, self.grader, self._private_dir = episode, grader, private_dir

    async def verdict(self) -> Verdict:
        """The world's verdict (the agent is done), with the grader's calls; the world's
        process is ended either way."""
        try:
            verdict = await asyncio.to_thread(self.episode.finish)
        finally:
            await self.close()
        if self.grader is not None:
            verdict.grader = self.grader.record()
        return verdict

    async def close(self) -> None:
        await asyncio.to_thread(self.episode.close)
        if self._private_dir is not None:
            shutil.rmtree(self._private_dir, ignore_errors=True)


async def start_episode(fmt: Any, task: Task, *, socket: Path | None, oracle: bool, grader: Any) -> RunningEpisode:
    """Start ``task``'s world and wait until it serves its tools at ``socket`` (None: a
    private path, for the oracle). ``grader``: this rollout's grader (None when the format
    asks for none)."""
    private = None
    if socket is None:
        private = Path(tempfile.mkdtemp(prefix="milo-episode-"))
        socket = private / "tools.sock"
    try:
        episode = await asyncio.to_thread(fmt.start_episode, task, socket, oracle=oracle, grader=grader)
    except BaseException:
        if private is not None:
            shutil.rmtree(private, ignore_errors=True)
        raise
    running = RunningEpisode(episode, grader, private)
    try:
        await asyncio.to_thread(episode.wait_ready)
    except RuntimeError as exc:
        await running.close()
        raise InfraFailure(f"task world did not start: {exc}", []) from None
    except BaseException:
        await running.close()
        raise
    return running
