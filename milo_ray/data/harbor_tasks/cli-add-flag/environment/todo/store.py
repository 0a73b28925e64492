"""Loading, saving and changing the to-do items (a JSON list in one file)."""

import json
import os
from pathlib import Path

PRIORITIES = ("low", "normal", "high")


def path():
    """The data file: $TODO_FILE, else /app/todo.json."""
    return Path(os.environ.get("TODO_FILE", "/app/todo.json"))


def load():
    p = path()
    return json.loads(p.read_text()) if p.exists() else []


def save(items):
    path().write_text(json.dumps(items, indent=2) + "\n")


def add(items, title, priority="normal"):
    item = {"id": max((i["id"] for i in items), default=0) + 1, "title": title, "priority": priority, "done": False}
    items.append(item)
    return item


def mark_done(items, item_id):
    for item in items:
        if item["id"] == item_id:
            item["done"] = True
            return item
    raise KeyError(item_id)
