"""The bottom layer: value types every other package shares (tasks, rollouts, cache keys,
seeds, task formats, LLM endpoint settings). Nothing here imports from another milo_ray
package; see docs/design.md, "Layers"."""
