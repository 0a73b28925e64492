"""A method that fails with a bug, to check how the entry point reports a crash."""

from __future__ import annotations

from milo_ray.evaluation import EvalMethod


class CrashingEval(EvalMethod):
    def run(self, ctx):
        ctx.store.event("about_to_crash", {})
        raise RuntimeError("a bug in the method")


class BuggyConstructorEval(EvalMethod):
    """Takes its arguments fine, then fails inside its constructor with a TypeError."""

    def __init__(self, k: int = 5, split: str = "test", names=()):
        super().__init__(k=k, split=split, names=names)
        self.width = len(self.k)  # a bug: k is an int
