"""GAIA-2 scenarios of Meta's Agents Research Environments (ARE): reading local scenario
JSON (:mod:`.scenarios`), the host-side process that holds one scenario's environment and
judge under ARE's own interpreter (:mod:`.host`) and its driver on this side, which
answers the judge's LLM checks through the grader role (:mod:`.episode`), the per-rollout
tool channel between that process and the harness's sandbox (:mod:`.channel` host side,
:mod:`.tools` the harness's langchain tools) and ARE's argument type strings as JSON
Schema (:mod:`.tool_schema`)."""
