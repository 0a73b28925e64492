"""A method that fails with a bug, to check how the entry point reports a crash."""

from __future__ import annotations

from milo_ray.evaluation import EvalMethod


class CrashingEval(EvalMethod):
    def run(self, ctx):
        ctx.store.event("about_to_crash", {})
        raise RuntimeError("a bug in the method")
