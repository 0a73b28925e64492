"""The orchestrator's decision JSON (MILO §4.1.3, App. C.2) and its validation.

Owns the one definition of what an orchestrator may return, shared by the offline
rule-based orchestrator and any LLM orchestrator. A decision is a diagnosis plus at
most ``max_moves`` moves drawn from Reassign, Graft (``recombine``), Speciate and
Curriculum::

    {
      "diagnosis": "2-4 sentences grounded in the snapshot",
      "kind": "dry_mutator | exhausted_lineage | crowded_out_niche | population_plateau",
      "loci": ["variation", "structure", "curriculum"],
      "reassign":  [{"island": 1, "mutator": "bold", "why": "..."}],
      "recombine": [{"dest_island": 1, "donor_island": 0, "why": "..."}],
      "speciate":  [{"from_island": 2, "harness_id": "<node id or harness id>", "mutator": "sloppy", "why": "..."}],
      "curriculum": {"tasks": ["t-01", "t-07"], "why": "..."} | null
    }

Move counting follows the paper's prompt: re-mapping any number of islands in one
``reassign`` list is ONE move; every recombine entry, every speciate entry and a
curriculum change count one each.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import jsonschema

DIAGNOSES: tuple[str, ...] = ("dry_mutator", "exhausted_lineage", "crowded_out_niche", "population_plateau")
LOCI: tuple[str, ...] = ("variation", "structure", "curriculum")

_WHY = {"type": "string"}
DECISION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["diagnosis"],
    "additionalProperties": False,
    "properties": {
        "diagnosis": {"type": "string", "minLength": 1},
        "kind": {"enum": list(DIAGNOSES)},
        "loci": {"type": "array", "items": {"enum": list(LOCI)}},
        "reassign": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["island", "mutator"],
                "additionalProperties": False,
                "properties": {"island": {"type": "integer"}, "mutator": {"type": "string"}, "why": _WHY},
            },
        },
        "recombine": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["dest_island", "donor_island"],
                "additionalProperties": False,
                "properties": {
                    "dest_island": {"type": "integer"},
                    "donor_island": {"type": "integer"},
                    "why": _WHY,
                },
            },
        },
        "speciate": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["from_island", "harness_id", "mutator"],
                "additionalProperties": False,
                "properties": {
                    "from_island": {"type": "integer"},
                    "harness_id": {"type": "string"},
                    "mutator": {"type": "string"},
                    "why": _WHY,
                },
            },
        },
        "curriculum": {
            "anyOf": [
                {"type": "null"},
                {
                    "type": "object",
                    "required": ["tasks"],
                    "additionalProperties": False,
                    "properties": {
                        "tasks": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                        "why": _WHY,
                    },
                },
            ]
        },
    },
}


class DecisionError(ValueError):
    """A decision the loop cannot execute; the message names the offending field."""


def count_moves(decision: Mapping[str, Any]) -> int:
    """Moves in a (structurally valid) decision: the whole reassign list is one move."""
    return (
        (1 if decision.get("reassign") else 0)
        + len(decision.get("recombine") or [])
        + len(decision.get("speciate") or [])
        + (1 if decision.get("curriculum") else 0)
    )


def validate_decision(
    decision: Any,
    *,
    islands: Iterable[int],
    mutators: Iterable[str],
    max_moves: int = 2,
    harnesses: Mapping[int, Iterable[str]] | None = None,
    tasks: Iterable[str] | None = None,
    assignment: Mapping[int, str] | None = None,
) -> dict[str, Any]:
    """Check ``decision`` against the schema and the current search configuration.

    islands: existing island ids; mutators: names in the pool G.
    harnesses: optional island -> ids (node ids or harness ids) that island holds, to
        check that a speciated harness exists in ``from_island``.
    tasks: optional task ids a curriculum may draw from.
    assignment: optional island -> current mutator; a reassignment to the mutator the
        island already has is rejected (the paper requires mu != m_j).
    Returns a normalized copy (every move key present, lists possibly empty);
    raises :class:`DecisionError` naming the field and what to do instead.
    """
    if not isinstance(decision, Mapping):
        raise DecisionError(f"decision must be a JSON object, got {type(decision).__name__}")
    try:
        jsonschema.validate(dict(decision), DECISION_SCHEMA)
    except jsonschema.ValidationError as e:
        where = "/".join(str(p) for p in e.absolute_path) or "<root>"
        raise DecisionError(f"decision field {where}: {e.message}") from None
    isl = set(int(i) for i in islands)
    pool = set(mutators)
    d: dict[str, Any] = {
        "diagnosis": decision["diagnosis"],
        "kind": decision.get("kind"),
        "loci": list(decision.get("loci") or []),
        "reassign": [dict(m) for m in decision.get("reassign") or []],
        "recombine": [dict(m) for m in decision.get("recombine") or []],
        "speciate": [dict(m) for m in decision.get("speciate") or []],
        "curriculum": dict(decision["curriculum"]) if decision.get("curriculum") else None,
    }
    n = count_moves(d)
    if n > max_moves:
        raise DecisionError(
            f"decision has {n} moves but at most {max_moves} are allowed "
            "(a whole reassign list is one move; each recombine/speciate entry and a curriculum are one each)"
        )

    def _island(field: str, value: int) -> None:
        if value not in isl:
            raise DecisionError(f"decision field {field}: unknown island {value}; existing islands are {sorted(isl)}")

    def _mutator(field: str, value: str) -> None:
        if value not in pool:
            raise DecisionError(f"decision field {field}: mutator {value!r} is not in the pool {sorted(pool)}")

    seen: set[int] = set()
    for i, m in enumerate(d["reassign"]):
        _island(f"reassign[{i}].island", m["island"])
        _mutator(f"reassign[{i}].mutator", m["mutator"])
        if m["island"] in seen:
            raise DecisionError(f"decision field reassign[{i}].island: island {m['island']} is reassigned twice")
        seen.add(m["island"])
        if assignment is not None and assignment.get(m["island"]) == m["mutator"]:
            raise DecisionError(
                f"decision field reassign[{i}].mutator: island {m['island']} already uses {m['mutator']!r}; "
                "pick a different mutator from the pool"
            )
    for i, m in enumerate(d["recombine"]):
        _island(f"recombine[{i}].dest_island", m["dest_island"])
        _island(f"recombine[{i}].donor_island", m["donor_island"])
        if m["dest_island"] == m["donor_island"]:
            raise DecisionError(
                f"decision field recombine[{i}]: donor_island == dest_island == {m['dest_island']}; "
                "a graft needs two different islands"
            )
    for i, m in enumerate(d["speciate"]):
        _island(f"speciate[{i}].from_island", m["from_island"])
        _mutator(f"speciate[{i}].mutator", m["mutator"])
        if harnesses is not None and m["harness_id"] not in set(harnesses.get(m["from_island"], ())):
            raise DecisionError(
                f"decision field speciate[{i}].harness_id: {m['harness_id']!r} is not a harness of island "
                f"{m['from_island']}"
            )
    if d["curriculum"] is not None and tasks is not None:
        known = set(tasks)
        unknown = [t for t in d["curriculum"]["tasks"] if t not in known]
        if unknown:
            raise DecisionError(f"decision field curriculum.tasks: unknown task ids {unknown[:5]}")
        if len(set(d["curriculum"]["tasks"])) != len(d["curriculum"]["tasks"]):
            raise DecisionError("decision field curriculum.tasks: duplicate task ids")
    return d
