"""Local GAIA-2 / ARE scenario files read into plain facts, without ARE installed.

A scenario is one self-contained JSON object in ARE's export format (``version``
``are_simulation_v1``): ``metadata.definition`` (``scenario_id``, ``duration``,
``start_time``), ``apps`` (each ``name``, ``class_name``, ``app_state``), ``events``
(user messages, environment events and ``OracleEvent`` rows, each with an ``action``
naming ``app``, ``function`` and ``args``). A suite is a directory of ``*.json`` files
(one scenario each) or one ``.jsonl`` file (one scenario a line), the two layouts
``are-benchmark run -d`` takes. The scenario JSON itself is handed, unchanged, to the
host process that runs it under ARE (:mod:`.host`); what is read here is what a task
needs before that: its id, the first user message (the task's instruction), how many
user turns and oracle actions it has, and its duration.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

USER_APP, USER_FN = "AgentUserInterface", "send_message_to_agent"
ORACLE = "OracleEvent"


@dataclass(frozen=True)
class ScenarioFacts:
    scenario_id: str
    first_message: str
    user_turns: int
    oracle_actions: int
    duration_s: float | None
    apps: tuple[str, ...]
    raw: str  # the scenario's JSON text, as read


def _args(action: dict[str, Any]) -> dict[str, Any]:
    args = action.get("args") or []
    if isinstance(args, dict):
        return args
    return {a.get("name"): a.get("value") for a in args if isinstance(a, dict)}


def parse_scenario(text: str, where: str) -> ScenarioFacts:
    """The facts of one scenario JSON text; ``ValueError`` naming ``where`` and the field."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{where}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{where}: a scenario is a JSON object (ARE's export format)")
    definition = (data.get("metadata") or {}).get("definition") if isinstance(data.get("metadata"), dict) else None
    if not isinstance(definition, dict) or not isinstance(definition.get("scenario_id"), str) \
            or not definition["scenario_id"]:
        raise ValueError(f"{where}: metadata.definition.scenario_id: missing (a scenario exported by ARE has it)")
    apps, events = data.get("apps"), data.get("events")
    if not isinstance(apps, list) or not all(isinstance(a, dict) and isinstance(a.get("name"), str) for a in apps):
        raise ValueError(f"{where}: apps: a list of {{name, class_name, app_state}} objects")
    if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
        raise ValueError(f"{where}: events: a list of event objects")
    messages = []
    oracle = 0
    for e in events:
        action = e.get("action") if isinstance(e.get("action"), dict) else {}
        if e.get("class_name") == ORACLE:
            oracle += 1
        elif action.get("app") == USER_APP and action.get("function") == USER_FN:
            messages.append((e.get("event_time") or 0, _args(action).get("content") or ""))
    if not messages:
        raise ValueError(f"{where}: events: no user message ({USER_APP}.{USER_FN}), so the scenario has no task")
    messages.sort(key=lambda m: (m[0] if isinstance(m[0], (int, float)) else 0))
    duration = definition.get("duration")
    return ScenarioFacts(scenario_id=definition["scenario_id"], first_message=str(messages[0][1]),
                         user_turns=len(messages), oracle_actions=oracle,
                         duration_s=float(duration) if isinstance(duration, (int, float)) else None,
                         apps=tuple(a["name"] for a in apps), raw=text)


def read_suite(path: Path) -> tuple[dict[str, ScenarioFacts], dict[str, str]]:
    """(scenario id -> facts, name -> why it could not be read) for a directory of
    ``*.json`` scenarios or one ``.jsonl`` file. ``ValueError`` for a path that is
    neither, or two scenarios with one id."""
    texts: list[tuple[str, str]] = []
    if path.is_dir():
        texts = [(p.name, p.read_text(errors="replace")) for p in sorted(path.glob("*.json")) if p.is_file()]
        if not texts:
            raise ValueError(f"{path}: no *.json scenario file in it")
    elif path.is_file() and path.suffix in (".jsonl", ".ndjson"):
        texts = [(f"{path.name}:{i}", ln) for i, ln in enumerate(path.read_text(errors="replace").splitlines(), 1)
                 if ln.strip()]
    else:
        raise ValueError(f"{path}: give a directory of ARE scenario *.json files or one .jsonl file")
    found: dict[str, ScenarioFacts] = {}
    bad: dict[str, str] = {}
    for where, text in texts:
        try:
            facts = parse_scenario(text, where)
        except ValueError as exc:
            bad[where] = str(exc)
            continue
        if facts.scenario_id in found:
            raise ValueError(f"{where}: scenario_id {facts.scenario_id!r} appears twice in {path}")
        found[facts.scenario_id] = facts
    return found, bad


def looks_like_suite(path: Path) -> bool:
    """Whether ``path`` holds ARE scenarios (its first scenario file has ARE's keys)."""
    try:
        if path.is_dir():
            first = next(iter(sorted(path.glob("*.json"))), None)
            text = first.read_text(errors="replace") if first else ""
        elif path.is_file() and path.suffix in (".jsonl", ".ndjson"):
            with path.open(errors="replace") as f:
                text = f.readline()
        else:
            return False
        data = json.loads(text)
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and "apps" in data and "events" in data and isinstance(data.get("metadata"), dict)
