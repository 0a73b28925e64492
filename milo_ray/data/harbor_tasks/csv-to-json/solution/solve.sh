#!/bin/bash
set -euo pipefail
cd /app
mkdir -p output
python3 - <<'PY'
import csv, json
INTS = {"id", "salary", "manager_id"}
with open("data/employees.csv", newline="") as f:
    rows = [{k: (None if v == "" else int(v) if k in INTS else v) for k, v in r.items()} for r in csv.DictReader(f)]
json.dump(rows, open("output/employees.json", "w"), indent=2)
depts = {}
for r in rows:
    depts.setdefault(r["department"], []).append(r["name"])
json.dump({d: sorted(n) for d, n in depts.items()}, open("output/by_department.json", "w"), indent=2)
PY
