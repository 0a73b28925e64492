"""Ranking a game's results."""


def rank(entries):
    """Rank result entries, each a dict {"name": str, "score": int, "time": float}.

    Returns a NEW list of new dicts (the input list and its dicts are left unchanged), ordered
    by score (highest first), then time (lowest first), then name (case-insensitive A-Z).
    Each returned dict is a copy of its entry with an extra key "rank": the 1-based position,
    except that entries with equal score AND equal time share the rank of the first of them
    (competition ranking: 1, 2, 2, 4).
    """
    ordered = sorted(entries, key=lambda e: e["name"])
    for position, entry in enumerate(ordered):
        entry["rank"] = position
    return ordered


def top(entries, n):
    """The names of the first `n` ranked entries (all of them if fewer)."""
    return [e["name"] for e in rank(entries)[:n]]
