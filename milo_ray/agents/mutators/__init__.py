"""Mutators: agents that write a child harness from a parent and its evidence."""

from milo_ray.agents.mutators.offline import PERSONALITIES, OfflineCandidateOptimizer, OfflineMutator

__all__ = ["PERSONALITIES", "OfflineCandidateOptimizer", "OfflineMutator"]
