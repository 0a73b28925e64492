"""What the benchmarks of real tasks share about setting a task up (the
:class:`~milo_ray.core.tasks.TaskFormat` protocol itself is in :mod:`milo_ray.core`).

``metadata`` holds plain values, and a task's files as a
:class:`~milo_ray.boundary.shipping.ShippedTree` (``metadata["files"]``): content put into
the object store once and unpacked once per node, so a node that does not share the
driver's disk runs the task all the same. A format resolves the paths it needs against
the unpacked tree before it builds the :class:`~milo_ray.boundary.sandbox.base.SandboxSpec`.
"""

from __future__ import annotations

# Wall time a real rollout needs besides the agent's and the verifier's own caps: opening
# the sandbox (copying the workspace; under Docker, starting a container and, the first
# time a task runs on a node, building its image) and closing it. A task's
# ``grading_cap_s`` is its verifier timeout plus this.
SETUP_ALLOWANCE_S = 300.0
