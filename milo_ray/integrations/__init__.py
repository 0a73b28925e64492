"""Bridges from milo_ray to other evaluation frameworks.

Each submodule imports its framework at import time and is imported only by that
framework (e.g. Harbor loads ``milo_ray.integrations.harbor:HarnessAgent``), so
``import milo_ray`` never needs them installed.
"""
