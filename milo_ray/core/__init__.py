"""The bottom layer: value types every other package shares -- tasks and the task format
each carries (:mod:`.tasks`), rollout requests, results and cache keys (:mod:`.rollouts`),
the executor protocol (:mod:`.executor`), seed derivation (:mod:`.seeds`), which failures
are the model endpoint's (:mod:`.failures`) -- and the layer table itself (:mod:`.layers`).
Nothing here imports from another milo_ray package except for annotations (under
``TYPE_CHECKING``); see docs/design.md, "Layers"."""
