#!/bin/bash
set -euo pipefail
cd /app
python3 - <<'PY'
import json, re
from collections import Counter
LINE = re.compile(r'(\S+) \S+ \S+ \[(\d{2})/(\w{3})/(\d{4}):(\d{2}):\d{2}:\d{2} [+-]\d{4}\] "(\S+) (\S+) (\S+)" (\d{3}) (\d+|-)')
MONTHS = {m: i for i, m in enumerate("Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec".split(), 1)}
rows, malformed = [], 0
for line in open("logs/access.log").read().splitlines():
    m = LINE.fullmatch(line)
    if m:
        rows.append(m.groups())
    else:
        malformed += 1
paths = Counter(r[6].split("?", 1)[0] for r in rows)
hours = Counter(f"{r[3]}-{MONTHS[r[2]]:02d}-{r[1]}T{r[4]}" for r in rows)
report = {
    "total_requests": len(rows),
    "malformed_lines": malformed,
    "unique_ips": len({r[0] for r in rows}),
    "methods": dict(Counter(r[5] for r in rows)),
    "status_counts": dict(Counter(r[8] for r in rows)),
    "bytes_total": sum(int(r[9]) for r in rows if r[9] != "-"),
    "error_rate": round(sum(int(r[8]) >= 400 for r in rows) / len(rows), 4),
    "top_paths": [{"path": p, "count": c} for p, c in sorted(paths.items(), key=lambda x: (-x[1], x[0]))[:5]],
    "busiest_hour": min(hours, key=lambda h: (-hours[h], h)),
}
json.dump(report, open("report.json", "w"), indent=2)
PY
