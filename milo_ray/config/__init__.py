"""Configuration: the structured schemas Hydra types the run with, where ``conf/`` is, the
``--help`` text, the typed errors of bad input, and the checks a composed config passes
before a run writes anything.

Two layers (docs/design.md, "Layers"): ``schemas``, ``paths``, ``help`` and ``errors``
import nothing of milo_ray above the core; ``validate`` and ``targets`` check a composed
config against what it builds (agents, executors, seeds), so they sit above the packages
whose constructors they inspect.
"""
