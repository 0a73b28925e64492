"""What the current trust boundary costs per rollout, against an earlier release of it,
measured in the same run.

    PYTHONPATH=. python scripts/bench_isolation.py [--against bff19bc] [--rounds 5] [--rollouts 3]

The earlier release (``--against``, a git revision; default ``bff19bc``, the last commit
before per-sandbox uids, the seccomp filter, per-grant gateway sockets, private networks
for every sandbox and the storage volume) is checked out into a temporary git worktree.
Each round runs, in a fresh interpreter per version, ``--rollouts`` rollouts of the same
bundled Harbor task with the minimal seed harness through that version's real
``AgentExecutor`` (bwrap, no warm spare: the cold path pays every part of the isolation)
against a local scripted model, first the earlier release, then this checkout; rounds
alternate so a load spike on a shared machine hits both alike. It prints the median wall
time per rollout of each version, the difference (what the current isolation adds per
rollout; target under 100 ms) and the ratio, plus the load average. What a model call
adds through the gateway is ``scripts/bench_sandbox.py --only boundary``'s figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Runs in the version under test (PYTHONPATH = its tree): the same rollouts through its own
# executor. Module paths that moved between releases are tried in turn.
_CHILD = r'''
import asyncio, json, os, sys, time
# An editable install's import hook would serve a module this tree lacks from the installed
# checkout (a module path that moved between releases); only this tree's code may run here.
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in getattr(f, "__module__", "")]
sys.path.insert(0, os.getcwd())
from milo_ray.testing.openai_server import ScriptedOpenAIServer, reply, tool_call
from milo_ray.benchmarks.harbor import HarborBenchmark
from milo_ray.harness.seeds import load_seeds
from milo_ray.execution.agent_executor import AgentExecutor

def scripted(body):
    if any(m.get("role") == "tool" for m in body.get("messages", [])):
        return reply("Done.", prompt_tokens=900, completion_tokens=20)
    return tool_call("write_file", {"file_path": "/app/NOTES.md", "content": "checked\n"},
                     prompt_tokens=600, completion_tokens=40)

target = None
for mod in ("milo_ray.boundary.sandbox.bwrap", "milo_ray.execution.sandbox.bwrap"):
    try:
        __import__(mod)
        target = mod + ".BwrapSandboxFactory"
        break
    except ImportError:
        pass
n = int(sys.argv[1])
os.environ.setdefault("BENCH_SOLVER_KEY", "local")
splits = HarborBenchmark().splits()
task = splits["test"][0] if "test" in splits else [t for s in splits.values() for t in s][0]
harness = load_seeds(["minimal"])[0]
with ScriptedOpenAIServer(scripted) as srv:
    cfg = {"solver": "openai/scripted", "api_base": srv.url, "api_key_env": "BENCH_SOLVER_KEY", "max_retries": 0}
    ex = AgentExecutor(model=cfg, sandbox={"_target_": target}, warm_processes=0)

    async def run():
        out = []
        for i in range(n + 1):  # the first one warms this interpreter's own imports up
            t = time.perf_counter()
            res = await ex.aexecute(harness, task, i, 0)
            took = time.perf_counter() - t
            if i:
                tr = res.trace or {}
                out.append({"s": took, "score": res.score, "error_kind": res.error_kind, "error": res.error,
                            "startup_s": tr.get("trajectory", {}).get("startup_s"),
                            "agent_s": tr.get("trajectory", {}).get("agent_seconds"),
                            "verify_s": (tr.get("verifier") or {}).get("seconds")})
        return out

    import milo_ray
    print("RESULT " + json.dumps({"code": os.path.dirname(milo_ray.__file__), "rollouts": asyncio.run(run())}))
'''


def _worktree(ref: str) -> Path:
    where = Path(tempfile.mkdtemp(prefix="milo-bench-release-")) / "tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), ref], check=True,
                   capture_output=True)
    return where


def _round(tree: Path, n: int) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, "-c", _CHILD, str(n)], cwd=tree, env=env, capture_output=True,
                          text=True, timeout=1800)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if done.returncode or line is None:
        raise SystemExit(f"rollouts in {tree} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    got = json.loads(line[len("RESULT "):])
    if Path(got["code"]).resolve() != (tree / "milo_ray").resolve():
        raise SystemExit(f"the rollouts meant for {tree} ran the code in {got['code']}")
    return got["rollouts"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", default="bff19bc", help="the earlier release (a git revision)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (each version once per round)")
    parser.add_argument("--rollouts", type=int, default=3, help="rollouts per version and round")
    args = parser.parse_args(argv)
    old_tree = _worktree(args.against)
    try:
        times: dict[str, list[float]] = {"earlier": [], "current": []}
        parts: dict[str, list[dict]] = {"earlier": [], "current": []}
        for r in range(args.rounds):
            for name, tree in (("earlier", old_tree), ("current", ROOT)):
                rows = _round(tree, args.rollouts)
                bad = [row for row in rows if row["error_kind"]]
                if bad:
                    raise SystemExit(f"{name}: a rollout failed, so its time is not comparable: {bad[0]}")
                times[name] += [row["s"] for row in rows]
                parts[name] += rows
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old_tree)], capture_output=True)
    old, new = statistics.median(times["earlier"]), statistics.median(times["current"])
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"load average {load} on {os.cpu_count()} CPUs (wall times grow with it)")
    print(f"earlier release ({args.against})  {old * 1000:8.1f} ms per rollout  (median of {len(times['earlier'])})")
    print(f"current checkout         {new * 1000:8.1f} ms per rollout  (median of {len(times['current'])})")
    for name in ("earlier", "current"):
        shown = []
        for key, label in (("startup_s", "harness process start"), ("agent_s", "agent"), ("verify_s", "grading")):
            got = [r[key] for r in parts[name] if r.get(key) is not None]
            if got:
                shown.append(f"{label} {statistics.median(got) * 1000:.0f} ms")
        print(f"  {name}: " + ", ".join(shown) + " (medians; the rest of a rollout is opening and closing sandboxes)")
    print(f"added by the current isolation  {(new - old) * 1000:+8.1f} ms per rollout  "
          f"(ratio {new / old:.3f}; target under +100 ms; cold path: no warm spare, bwrap)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
