"""The host-side process that holds one ARE scenario for one rollout: its apps' state, its
event loop and its judge. Runs under ARE's own interpreter (``scripts/are_env.sh``;
``MILO_RAY_ARE_PYTHON``), never in the harness's sandbox, started by
:class:`~milo_ray.benchmarks.are.episode.Episode` as

    python host.py --scenario FILE --socket PATH --judge scripted|grader --mode agent|oracle

It imports ARE, the standard library and this package's dependency-free modules
(:mod:`.channel`, :mod:`.tool_schema`) only. It

1. loads the scenario JSON, runs ARE's preprocessing (an oracle run that the judge keeps
   as its reference, the turns and their trigger conditions) with the judge configuration
   asked for: ``scripted`` (ARE's scripted judge: no LLM check) or ``grader`` (ARE's
   per-event judge whose LLM checks are sent to the parent, which answers them through
   the grader role);
2. starts the environment and serves the scenario's app tools on the tool channel
   (``--socket``, :mod:`.channel`), then says ``ready``;
3. in ``oracle`` mode replays the scenario's oracle actions through those same tools, in
   dependency order, waiting for the environment events they depend on (the reference
   solution); in ``agent`` mode waits for the parent's ``finish``;
4. says ``verdict``: ARE's judgment of the episode (``success``, its rationale) and the
   agent's actions.

Protocol with the parent: one JSON object a line, this process's stdout to the parent
(``ready``, ``grader`` requests, ``verdict``, ``error``) and stdin from it (``finish``,
``grader_answer``). ARE's own logging goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file by ARE's interpreter: this checkout's modules by path
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from milo_ray.benchmarks.are.channel import ToolChannel  # noqa: E402
from milo_ray.benchmarks.are.tool_schema import parameters_schema  # noqa: E402

# Wall seconds one wait may block for a notification once simulated time has been told to
# jump to the next event (the environment's loop ticks on its own thread).
WAIT_WALL_S = 20.0
# How long the world may take to deliver the user's first message before the agent acts.
FIRST_TURN_WALL_S = 60.0
FIRST_TURN_NEAR_S = 5.0
# The agent's actions kept for the verdict: the first this many, each argument list cut here.
MAX_LOGGED_ACTIONS = 200
ACTION_ARGS_CHARS = 500


class Parent:
    """The parent process at the other end of stdin/stdout."""

    def __init__(self) -> None:
        self._out = sys.stdout
        sys.stdout = sys.stderr  # anything ARE prints is not protocol
        self._lock = threading.Lock()
        self._answers: dict[int, dict[str, Any]] = {}
        self._cond = threading.Condition()
        self.finished = threading.Event()
        self._next = 0
        threading.Thread(target=self._read, daemon=True).start()

    def send(self, **msg: Any) -> None:
        with self._lock:
            self._out.write(json.dumps(msg) + "\n")
            self._out.flush()

    def _read(self) -> None:
        for line in sys.stdin:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if msg.get("t") == "finish":
                self.finished.set()
            elif msg.get("t") == "grader_answer":
                with self._cond:
                    self._answers[int(msg["id"])] = msg
                    self._cond.notify_all()
        self.finished.set()  # the parent went away

    def ask_grader(self, system: str, user: str, purpose: str) -> str:
        with self._cond:
            self._next += 1
            rid = self._next
        self.send(t="grader", id=rid, system=system, user=user, purpose=purpose)
        with self._cond:
            while rid not in self._answers:
                if not self._cond.wait(timeout=600):
                    raise RuntimeError("the grader did not answer within 600 s")
            msg = self._answers.pop(rid)
        if msg.get("error"):
            raise RuntimeError(str(msg["error"]))
        return str(msg.get("text", ""))


class GraderEngine:
    """ARE's judge engine interface (``engine(messages) -> (text, metadata)``) answered by
    the parent's grader role."""

    def __init__(self, parent: Parent) -> None:
        self.parent, self.calls = parent, 0

    def __call__(self, messages: list[dict[str, Any]], **kwargs: Any) -> tuple[str, dict[str, Any]]:
        self.calls += 1
        system = "\n\n".join(_content(m) for m in messages if m.get("role") == "system")
        user = "\n\n".join(f"[{m.get('role')}]\n{_content(m)}" for m in messages if m.get("role") != "system")
        tags = kwargs.get("additional_trace_tags") or []
        return self.parent.ask_grader(system, user, purpose="are:" + ",".join(map(str, tags))), {}


def _content(m: dict[str, Any]) -> str:
    c = m.get("content")
    if isinstance(c, list):
        return "\n".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in c)
    return str(c or "")


class ScenarioTools:
    """The :class:`~.channel.ToolProvider` of a running scenario: its apps' tools and its
    notification queue."""

    def __init__(self, scenario: Any, env: Any) -> None:
        self.env = env
        self._by_name = {t.name: t for t in scenario.get_tools()}
        self._listed = [{"name": t.name, "description": t.function_description or t.name,
                         "parameters": parameters_schema([{"name": a.name, "type": a.arg_type,
                                                           "description": a.description,
                                                           "has_default": a.has_default} for a in t.args])}
                        for t in self._by_name.values()]
        self.actions = 0
        # What the agent did, for the verdict's details (the evidence a mutator reads).
        self.action_log: list[dict[str, Any]] = []

    def tools(self) -> list[dict[str, Any]]:
        return self._listed

    def call(self, name: str, args: dict[str, Any]) -> str:
        self.actions += 1
        entry: dict[str, Any] = {"tool": name, "args": json.dumps(args, default=str)[:ACTION_ARGS_CHARS]}
        if len(self.action_log) < MAX_LOGGED_ACTIONS:
            self.action_log.append(entry)
        try:
            result = self._by_name[name](**args)
        except Exception as exc:
            entry["error"] = f"{type(exc).__name__}: {exc}"[:ACTION_ARGS_CHARS]
            raise
        return "" if result is None else str(result)

    def _pull(self) -> list[str]:
        from datetime import datetime, timezone

        from are.simulation.notification_system import MessageType

        now = datetime.fromtimestamp(self.env.time_manager.time(), tz=timezone.utc)
        return [f"[{m.timestamp.strftime('%Y-%m-%d %H:%M:%S')}] {m.message}"
                for m in self.env.notification_system.message_queue.get_by_timestamp(now)
                if m.message_type != MessageType.ENVIRONMENT_STOP]

    def wait(self, timeout_s: float) -> list[str]:
        notes = self._pull()
        if notes or timeout_s <= 0:
            return notes
        # Simulated time jumps to the next event (or the timeout) instead of passing at wall speed.
        self._by_name["SystemApp__wait_for_notification"](timeout=max(1, int(timeout_s)))
        deadline = time.monotonic() + min(WAIT_WALL_S, timeout_s)
        while time.monotonic() < deadline:
            time.sleep(0.1)
            notes = self._pull()
            if notes:
                return notes
        return notes

    def completed_ids(self) -> set[str]:
        return {e.event_id for e in self.env.event_log.list_view()}


def replay_oracle(raw: dict[str, Any], tools: ScenarioTools) -> None:
    """The scenario's oracle actions called through ``tools`` in dependency order, each
    after the environment events it depends on have happened (the reference solution)."""
    from are.simulation.scenarios.scenario import Scenario

    events = {e["event_id"]: e for e in raw["events"]}
    oracle_ids = [i for i, e in events.items() if e["class_name"] == "OracleEvent"]
    done: set[str] = set()
    while len(done) < len(oracle_ids):
        ready = [i for i in oracle_ids if i not in done
                 and all(d in done for d in events[i]["dependencies"] if d in oracle_ids)]
        if not ready:
            raise RuntimeError("the oracle events' dependencies form a cycle")
        eid = ready[0]
        waits = 0
        while not all(d in done or d in tools.completed_ids() for d in events[eid]["dependencies"]
                      if d not in oracle_ids):
            waits += 1
            if waits > 30:
                raise RuntimeError(f"oracle event {eid}: the events it depends on never happened")
            tools.wait(600)
        action = events[eid]["action"]
        args = {a["name"]: Scenario._parse_parameter_value(a["value"], a["value_type"]) for a in action["args"] or []}
        tools.call(f"{action['app']}__{action['function']}", args)
        done.add(eid)
        tools._pull()  # what the oracle's own action triggers is not news to it


def deliver_first_turn(raw: dict[str, Any], tools: ScenarioTools) -> None:
    """Let the world deliver the user's first message before the agent acts: the agent has
    it already as its task's instruction, and an action the judge sees before the message
    it answers does not count. The notification is taken off the queue (it is not news)."""
    firsts = sorted((e.get("event_relative_time") or 0, e["event_id"]) for e in raw["events"]
                    if not e.get("dependencies") and (e.get("action") or {}).get("app") == "AgentUserInterface"
                    and (e.get("action") or {}).get("function") == "send_message_to_agent")
    if not firsts:
        return
    due_s, first = firsts[0]
    deadline = time.monotonic() + FIRST_TURN_WALL_S
    while first not in tools.completed_ids():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the scenario's first user message ({first}) was not delivered within "
                               f"{FIRST_TURN_WALL_S:g} s")
        # Due within seconds: the event loop takes it at wall speed; due later: simulated time jumps to it.
        if due_s > FIRST_TURN_NEAR_S:
            tools.wait(600)
        else:
            time.sleep(0.05)
    tools._pull()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", required=True)
    ap.add_argument("--socket", required=True)
    ap.add_argument("--judge", choices=("scripted", "grader"), default="scripted")
    ap.add_argument("--mode", choices=("agent", "oracle"), default="agent")
    opts = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    parent = Parent()
    began = time.monotonic()
    try:
        from are.simulation.data_handler.importer import JsonScenarioImporter
        from are.simulation.environment import Environment, EnvironmentConfig
        from are.simulation.notification_system import VerboseNotificationSystem
        from are.simulation.scenarios.scenario_imported_from_json.utils import preprocess_scenario
        from are.simulation.validation import GraphPerEventJudgeConfig, ScriptedGraphPerEventJudgeConfig

        text = Path(opts.scenario).read_text()
        scenario, _, _ = JsonScenarioImporter().import_from_json_to_benchmark(text)
        engine = GraderEngine(parent)
        judge = ScriptedGraphPerEventJudgeConfig() if opts.judge == "scripted" else GraphPerEventJudgeConfig(
            engine=engine)
        preprocess_scenario(scenario, judge_config=judge)
        env = Environment(EnvironmentConfig(start_time=scenario.start_time, exit_when_no_events=False,
                                            time_increment_in_seconds=scenario.time_increment_in_seconds),
                          notification_system=VerboseNotificationSystem())
        env.run(scenario, wait_for_end=False)
        tools = ScenarioTools(scenario, env)
        # World-connectable: the sandbox's user differs from this one; the directory the
        # socket is made in (the rollout's, bound into its sandbox only) is what limits who reaches it.
        if opts.mode == "agent":
            deliver_first_turn(json.loads(text), tools)
        channel = ToolChannel(tools, opts.socket, mode=0o666)
        parent.send(t="ready", tools=len(tools.tools()), turns=scenario.nb_turns,
                    setup_s=round(time.monotonic() - began, 3))
        if opts.mode == "oracle":
            replay_oracle(json.loads(text), tools)
        else:
            parent.finished.wait()
        channel.close()
        time.sleep(0.5)  # the last action's end-of-turn check runs on the environment's loop
        result = scenario.validate(env)
        env.stop()
        parent.send(t="verdict", success=result.success, rationale=str(getattr(result, "rationale", "") or "")[:20000],
                    exception=None if result.exception is None else repr(result.exception)[:4000],
                    agent_actions=tools.actions, action_log=tools.action_log, judge_llm_calls=engine.calls,
                    seconds=round(time.monotonic() - began, 3))
    except Exception as exc:
        parent.send(t="error", error=f"{type(exc).__name__}: {exc}"[:4000])
    sys.stdout.flush()


if __name__ == "__main__":
    main()
