"""MILO orchestrator agents: the decision schema shared by every orchestrator and
the offline rule-based orchestrator."""
