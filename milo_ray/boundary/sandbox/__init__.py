"""Sandboxes a rollout's agent acts in: bubblewrap (``bwrap``), Docker (``docker``) and the
trusted-debugging ``local`` shell. Each is a deepagents sandbox backend, so a harness uses
them unchanged; ``base`` holds what they share (the task's environment request, the
factory protocol the ``sandbox`` config group builds, process-tree execution)."""
