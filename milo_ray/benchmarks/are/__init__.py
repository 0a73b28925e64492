"""GAIA-2 scenarios of Meta's Agents Research Environments (ARE), the pieces that need no
ARE installation: reading local scenario JSON (:mod:`.scenarios`), mapping ARE's argument
type strings to JSON Schema (:mod:`.tool_schema`) and the per-rollout tool channel
between the host process that holds a scenario's environment and the harness's sandbox
(:mod:`.channel` host side, :mod:`.tools` the harness's langchain tools)."""
