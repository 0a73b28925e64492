#!/bin/bash
set -euo pipefail
cd /app/config
python3 - <<'PY'
import configparser, json, re
sections, current = {}, None
for line in open("service.ini").read().splitlines():
    stripped = line.strip()
    if not stripped or stripped.startswith(("#", ";")):
        continue
    if m := re.fullmatch(r"\[(.+)\]", stripped):
        current = sections.setdefault(m.group(1), {})
    elif m := re.fullmatch(r"(\w+)\s*[=:]\s*(.*)", stripped):
        current.pop(m.group(1), None)
        current[m.group(1)] = m.group(2)
    else:
        current[stripped] = "30"
with open("service.ini", "w") as f:
    for i, (name, options) in enumerate(sections.items()):
        f.write(("\n" if i else "") + f"[{name}]\n")
        f.writelines(f"{k} = {v.replace('%', '%%')}\n" for k, v in options.items())
parser = configparser.ConfigParser()
parser.read("service.ini")
typed = lambda v: int(v) if v.isdigit() else {"true": True, "false": False}.get(v, v)
json.dump({s: {k: typed(v) for k, v in parser[s].items()} for s in parser.sections()}, open("service.json", "w"), indent=2)
PY
