"""The one type every figure returns: :class:`milo_ray.search.plugin.Figure` (defined
there so a method's plugin can draw figures without importing the report)."""

from milo_ray.search.plugin import Figure

__all__ = ["Figure"]
