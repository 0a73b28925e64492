"""The host side of a rollout's harness process: starting it in its sandbox and reading
what it says (:mod:`.host`), and warm processes started ahead of their rollouts
(:mod:`.pool`). The process itself is :mod:`milo_ray.boundary.inside.harness_process`."""
