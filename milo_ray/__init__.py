"""milo_ray: automated agent-harness discovery (MILO and SSR) on Ray."""

__version__ = "0.1.0"
