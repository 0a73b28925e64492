#!/bin/bash
set -euo pipefail
cd /app
cat >> todo/store.py <<'PY'


STATUSES = ("open", "done", "all")
SORTS = ("id", "priority")


def query(items, status="all", priority=None, sort="id"):
    """The items with `status` and `priority` (None: any), ordered by `sort`; a new list."""
    if status not in STATUSES:
        raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
    if priority is not None and priority not in PRIORITIES:
        raise ValueError(f"priority must be one of {PRIORITIES} or None, got {priority!r}")
    if sort not in SORTS:
        raise ValueError(f"sort must be one of {SORTS}, got {sort!r}")
    kept = [i for i in items if (status == "all" or i["done"] == (status == "done"))
            and (priority is None or i["priority"] == priority)]
    if sort == "priority":
        return sorted(kept, key=lambda i: (-PRIORITIES.index(i["priority"]), i["id"]))
    return sorted(kept, key=lambda i: i["id"])
PY
python3 - <<'PY'
from pathlib import Path
p = Path("todo/cli.py")
src = p.read_text()
src = src.replace('''    sub.add_parser("list", help="list the items")
''', '''    lst = sub.add_parser("list", help="list the items")
    lst.add_argument("--status", choices=store.STATUSES, default="all")
    lst.add_argument("--priority", choices=store.PRIORITIES, default=None)
    lst.add_argument("--sort", choices=store.SORTS, default="id")
''')
src = src.replace('''        for item in items:
            print(format_item(item))''', '''        for item in store.query(items, args.status, args.priority, args.sort):
            print(format_item(item))''')
p.write_text(src)
PY
