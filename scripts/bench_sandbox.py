"""Per-command overhead of the sandboxes against a bare subprocess.

    PYTHONPATH=. python scripts/bench_sandbox.py [--n 50]

Each command (``true``, ``python3 -c pass``) runs ``--n`` times as a bare
``subprocess.run(["bash", "-c", cmd])`` with the sandbox's PATH (the baseline, named
"bare subprocess"), through the sandboxes' process runner alone (``run_capped``), through
an open bwrap sandbox's ``execute`` (with and without its cgroup), and -- when the Docker
sandbox imports and a Docker daemon answers -- through a Docker sandbox's ``execute``
(a ``docker exec``). It prints the median per command and its ratio to the baseline (the
target for bwrap is within 2x). :func:`main` runs the functions in ``SECTIONS`` in order;
:func:`suite_throughput` then measures rollouts per second of the bundled Harbor suite
with the real executor against a local scripted model at 1, 8 and 32 slots, and
:func:`boundary_overhead` what the trust boundary adds per rollout and per model call
against the in-worker baseline measured in the same run (``--only boundary`` runs just
that): a rollout with a cold harness process, one that finds a ready spare, and the steady
state of ``--concurrency`` rollouts in flight on one worker (``warm_processes: auto``) with
the scripted model taking each ``--call-latency`` per call; plus the CPU seconds and memory
of one harness process start, which unlike wall times do not grow with the machine's load
(printed first).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

from milo_ray.boundary.sandbox.base import Sandbox, SandboxSpec
from milo_ray.boundary.sandbox.bwrap import SANDBOX_PATH, BwrapSandboxFactory
from milo_ray.boundary.sandbox.process import run_capped

BASELINE = "bare subprocess"
COMMANDS = ("true", "python3 -c pass")


def interleaved_medians_ms(calls: dict[str, Callable[[], object]], n: int) -> dict[str, float]:
    """Median wall time of each call over ``n`` rounds, in ms. Each round runs every call
    once, in turn, so a load spike on a shared machine hits all of them alike rather than
    whichever was being measured at the time. One warm-up round first."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for round_no in range(n + 1):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            if round_no:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) * 1000 for name, t in times.items()}


def _bare(cmd: str) -> Callable[[], object]:
    # The sandbox's PATH, so both run the same python3 (the host's default may be a
    # different interpreter with a slower start-up).
    env = {"PATH": SANDBOX_PATH, "LANG": "C.UTF-8"}
    return lambda: subprocess.run(
        ["bash", "-c", cmd], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env=env, check=True
    )


def _through(sandbox: Sandbox, cmd: str) -> Callable[[], object]:
    def call() -> None:
        r = sandbox.execute(cmd)
        if r.exit_code != 0:
            raise RuntimeError(f"{cmd!r} failed in {sandbox.id}: {r.output[:300]}")

    return call


@contextlib.contextmanager
def bare(args: argparse.Namespace) -> Iterator[Callable[[str], Callable[[], object]] | None]:
    yield _bare


@contextlib.contextmanager
def runner(args: argparse.Namespace) -> Iterator[Callable[[str], Callable[[], object]] | None]:
    # The sandboxes' process runner without a sandbox: separates its cost from bwrap's.
    env = {"PATH": SANDBOX_PATH, "LANG": "C.UTF-8"}
    yield lambda cmd: lambda: run_capped(["bash", "-c", cmd], timeout_s=60, output_cap_bytes=100_000, env=env)


@contextlib.contextmanager
def bwrap(args: argparse.Namespace, cgroups: bool = True) -> Iterator[Callable[[str], Callable[[], object]] | None]:
    factory = BwrapSandboxFactory(cgroups=cgroups)
    spec = SandboxSpec(task_id="bench")
    why = factory.unsupported(spec)
    if why:
        print(f"bwrap: skipped ({why})")
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="bench_bwrap_") as scratch:
        with factory.open(spec, Path(scratch)) as sandbox:
            print(f"bwrap (cgroups={cgroups}) limits: {sandbox.limits}")
            yield lambda cmd: _through(sandbox, cmd)


@contextlib.contextmanager
def docker(args: argparse.Namespace) -> Iterator[Callable[[str], Callable[[], object]] | None]:
    try:
        from milo_ray.boundary.sandbox.docker import DockerSandboxFactory
        from milo_ray.testing.dockerd import daemon_answers, local_base_image, local_host_mounts
    except ImportError as exc:
        print(f"docker exec: skipped (the Docker sandbox does not import: {exc})")
        yield None
        return
    why = daemon_answers()
    if why is not None:
        print(f"docker exec: skipped (no Docker daemon answers: {why})")
        yield None
        return
    # The offline base image the Docker sandbox's tests use (the host's programs bind-mounted
    # read-only), so the measurement needs no pull; the task image is one WORKDIR on it.
    factory = DockerSandboxFactory(base_image_override=local_base_image(), host_mounts=local_host_mounts())
    with tempfile.TemporaryDirectory(prefix="bench_docker_") as scratch:
        context = Path(scratch) / "task"
        context.mkdir()
        (context / "Dockerfile").write_text("FROM registry.example/unpullable:1.0\nWORKDIR /app\n")
        spec = SandboxSpec(task_id="bench-docker", build_context=str(context))
        why = factory.unsupported(spec)
        if why:
            print(f"docker exec: skipped ({why})")
            yield None
            return
        with factory.open(spec, Path(scratch) / "scratch") as sandbox:
            yield lambda cmd: _through(sandbox, cmd)


# name -> context manager yielding "command -> callable running it there" (None: skipped).
# The first is the baseline the others are compared against.
# "bwrap, no cgroup" shows what the per-command cgroup join costs (a cgroup v1 migration
# waits for an RCU grace period, which grows with the machine's load).
BACKENDS = {
    BASELINE: bare,
    "run_capped": runner,
    "bwrap": bwrap,
    "bwrap, no cgroup": lambda args: bwrap(args, cgroups=False),
    "docker exec": docker,
}


def command_overhead(args: argparse.Namespace) -> None:
    """Per-command time of every backend against the bare subprocess."""
    with contextlib.ExitStack() as stack:
        makers = {name: stack.enter_context(cm(args)) for name, cm in BACKENDS.items()}
        makers = {name: make for name, make in makers.items() if make is not None}
        for cmd in COMMANDS:
            medians = interleaved_medians_ms({name: make(cmd) for name, make in makers.items()}, args.n)
            for name, ms in medians.items():
                ratio = ms / medians[BASELINE]
                print(f"{name:<17} {cmd:<16} median {ms:8.2f} ms   {ratio:5.2f}x {BASELINE}  (n={args.n})")


def _write_then_stop(body: dict) -> object:
    """A scripted solver: writes a note with the harness's write_file tool, then stops."""
    from milo_ray.testing.openai_server import reply, tool_call

    if any(m.get("role") == "tool" for m in body.get("messages", [])):
        return reply("Done.", prompt_tokens=900, completion_tokens=20)
    return tool_call("write_file", {"file_path": "/app/NOTES.md", "content": "checked\n"},
                     prompt_tokens=600, completion_tokens=40)


def suite_throughput(args: argparse.Namespace) -> None:
    """Rollouts per second of the bundled suite: the real executor (the minimal seed
    harness, bwrap, the tasks' own verifiers) against a local scripted model, through the
    Ray scheduler at 1, 8 and 32 concurrent slots (baseline: 1 slot)."""
    import os

    from milo_ray.benchmarks.harbor import HarborBenchmark
    from milo_ray.execution.cluster import start_local
    from milo_ray.execution.scheduler import RolloutScheduler
    from milo_ray.core.rollouts import RolloutRequest
    from milo_ray.harness.seeds import load_seeds
    from milo_ray.store import MemoryRunStore
    from milo_ray.testing.openai_server import ScriptedOpenAIServer

    os.environ.setdefault("BENCH_SOLVER_KEY", "local")
    tasks = [t for split in HarborBenchmark().splits().values() for t in split]
    harness = load_seeds(["minimal"])[0]
    start_local(num_cpus=os.cpu_count() or 2, slots=max(args.slots), configure_logging=False)
    rates: dict[int, float] = {}
    with ScriptedOpenAIServer(_write_then_stop) as srv:
        executor = {"_target_": "milo_ray.execution.agent_executor.AgentExecutor",
                    "model": {"solver": "openai/scripted", "api_base": srv.url, "api_key_env": "BENCH_SOLVER_KEY"},
                    "sandbox": {"_target_": "milo_ray.boundary.sandbox.bwrap.BwrapSandboxFactory"}}
        for slots in args.slots:
            sched = RolloutScheduler(executor, {t.task_id: t for t in tasks}, MemoryRunStore(run_id="bench"),
                                     "openai/scripted", "bench", slots_per_node=slots, progress=False,
                                     slot_resource="bench_slot_no_node_declares",
                                     worker_env={"BENCH_SOLVER_KEY": os.environ["BENCH_SOLVER_KEY"]})
            try:
                sched.add_harness(harness)
                # warm-up: the worker process imports the harness stack once
                sched.run([RolloutRequest(harness.harness_id, tasks[0].task_id, 10_000 + slots, seed=0)])
                requests = [RolloutRequest(harness.harness_id, t.task_id, i, seed=slots)
                            for i in range(args.rollouts_per_task) for t in tasks]
                start = time.perf_counter()
                results = sched.run(requests)
                rates[slots] = len(results) / (time.perf_counter() - start)
                bad = [r for r in results if r.error_kind]
                if bad:
                    print(f"  {len(bad)} rollouts failed, e.g. {bad[0].error_kind}: {bad[0].error}")
            finally:
                sched.close()
            base = rates[args.slots[0]]
            print(f"suite throughput  {slots:>2} slots  {rates[slots]:6.2f} rollouts/s   {rates[slots] / base:5.2f}x "
                  f"{args.slots[0]} slot(s)  ({len(requests)} rollouts of {len(tasks)} tasks)")


def _in_worker_rollout(harness, task, model_cfg, factory, scratch: Path):
    """The baseline: the harness imported and its agent run in this process, with the
    sandbox object and the key (how rollouts ran before the harness process existed; kept
    here only to measure against)."""
    import asyncio

    from milo_ray.llm.client import build_chat_model
    from milo_ray.core.tasks import format_of
    from milo_ray.boundary.inside.loader import load_harness

    fmt = format_of(task)
    sandbox = factory.open(fmt.sandbox_spec(task), scratch / "sandbox")
    try:
        module = load_harness(harness, scratch / "harnesses")
        agent = module.build_agent(build_chat_model(model_cfg, rate_limiter=None), sandbox)

        async def consume():
            async for _ in agent.astream({"messages": [{"role": "user", "content": task.instruction}]},
                                         config={"recursion_limit": 50}, stream_mode="values"):
                pass

        asyncio.run(consume())
        return fmt.verify(task, sandbox)
    finally:
        sandbox.close()


def _in_worker_batch(harness, task, model_cfg, factory, count: int, concurrency: int) -> list[float]:
    """Wall time of each of ``count`` in-worker rollouts, ``concurrency`` at a time (threads:
    the in-worker path ran the agent in the worker's process)."""
    import shutil
    from concurrent.futures import ThreadPoolExecutor

    def one(_: int) -> float:
        scratch = Path(tempfile.mkdtemp(prefix="milo-bench-"))
        try:
            t = time.perf_counter()
            _in_worker_rollout(harness, task, model_cfg, factory, scratch)
            return time.perf_counter() - t
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(one, range(count)))


async def _boundary_batch(ex, harness, task, count: int, concurrency: int, verdict_score: float,
                          ) -> tuple[list[float], int]:
    """Wall time of each of ``count`` rollouts through ``ex`` with ``concurrency`` in flight
    on this event loop (one worker with that many slots), and how many found a spare."""
    import asyncio

    sem = asyncio.Semaphore(concurrency)
    warm = 0

    async def one(i: int) -> float:
        nonlocal warm
        async with sem:
            t = time.perf_counter()
            res = await ex.aexecute(harness, task, i, 0)
            took = time.perf_counter() - t
        if res.error_kind or res.score != verdict_score:
            print(f"  rollout {i}: the two paths disagree ({res.error_kind}: {res.error})")
        warm += bool(res.trace["trajectory"].get("warm_process"))
        return took

    times = await asyncio.gather(*(one(i) for i in range(count)))
    return list(times), warm


async def _spares_ready(pool, n: int) -> None:
    import asyncio

    while sum(1 for v in pool._spares.values() for s in v if s.process.ready.is_set()) < n:
        await asyncio.sleep(0.05)


def _tree_usage(pid: int) -> tuple[float, float]:
    """(resident MB, CPU seconds so far) of ``pid`` and its descendants (a harness process
    is bwrap and the interpreter it started): CPU time does not grow with the machine's
    load the way wall time does."""
    import os

    rss_kb, ticks, todo = 0, 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                rss_kb += next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
            for t in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{t}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except (OSError, StopIteration):
            pass
    return rss_kb / 1024, ticks / os.sysconf("SC_CLK_TCK")


def boundary_overhead(args: argparse.Namespace) -> None:
    """What the trust boundary costs, against the in-worker baseline measured in the same
    run with the same scripted model: wall time per rollout (the harness process's start
    and imports, the gateway hop, the fresh grading sandbox) -- cold (no spare), warm (a
    spare ready), and in the steady state of ``--concurrency`` rollouts in flight on one
    worker (``warm_processes: auto``) at each ``--call-latency`` (the latency per model
    call is :func:`boundary_call_overhead`'s)."""
    import asyncio
    import os
    import shutil

    from milo_ray.benchmarks.harbor import HarborBenchmark
    from milo_ray.execution.agent_executor import AgentExecutor
    from milo_ray.boundary.sandbox.interpreter import with_interpreter
    from milo_ray.harness.seeds import load_seeds
    from milo_ray.testing.openai_server import ScriptedOpenAIServer

    os.environ.setdefault("BENCH_SOLVER_KEY", "local")
    splits = HarborBenchmark().splits()
    task = splits["test"][0] if "test" in splits else [t for split in splits.values() for t in split][0]
    harness = load_seeds(["minimal"])[0]
    latency = {"s": 0.0}

    def scripted(body: dict):
        r = _write_then_stop(body)
        r.delay_s = latency["s"]
        return r

    sandbox = {"_target_": "milo_ray.boundary.sandbox.bwrap.BwrapSandboxFactory"}
    med = lambda xs: statistics.median(list(xs))  # noqa: E731
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs "
          "(wall times grow with it; CPU seconds do not)")
    with ScriptedOpenAIServer(scripted) as srv:
        cfg = {"solver": "openai/scripted", "api_base": srv.url, "api_key_env": "BENCH_SOLVER_KEY", "max_retries": 0}
        factory = with_interpreter(BwrapSandboxFactory())
        cold_ex = AgentExecutor(model=cfg, sandbox=sandbox, warm_processes=0)
        model = cold_ex.model
        # The first round warms the in-worker imports up.
        first = Path(tempfile.mkdtemp(prefix="milo-bench-"))
        verdict = _in_worker_rollout(harness, task, model, factory, first)
        shutil.rmtree(first, ignore_errors=True)
        old = _in_worker_batch(harness, task, model, factory, args.rollouts, 1)
        mo = med(old)
        print(f"in-worker baseline  {mo:7.2f} s per rollout  (median of {args.rollouts}, one at a time)")

        async def cold_and_warm() -> tuple[list[float], list[float], list[float], float]:
            cold, _ = await _boundary_batch(cold_ex, harness, task, args.rollouts, 1, verdict.score)
            warm_ex = AgentExecutor(model=cfg, sandbox=sandbox, warm_processes=1)
            warm, startups = [], []
            usage = []
            for i in range(args.rollouts + 1):
                # A spare whose imports are done: what a rollout finds when the pool keeps up.
                warm_ex.pool.refill(task_spec(task))
                await _spares_ready(warm_ex.pool, 1)
                usage.append(_tree_usage(next(s for v in warm_ex.pool._spares.values() for s in v).process.proc.pid))
                t = time.perf_counter()
                res = await warm_ex.aexecute(harness, task, 1000 + i, 0)
                warm.append(time.perf_counter() - t)
                startups.append(res.trace["trajectory"]["startup_s"])
            await warm_ex.pool.aclose()
            return cold, warm[1:], startups[1:], usage

        cold, warm, startups, usage = asyncio.run(cold_and_warm())
        mc, mw = med(cold), med(warm)
        print(f"cold harness process  {mc:7.2f} s   added {mc - mo:+7.2f} s per rollout  (median of {args.rollouts}; "
              "no spare: interpreter start and imports in the sandbox)")
        print(f"warm harness process  {mw:7.2f} s   added {mw - mo:+7.2f} s per rollout  (median of {args.rollouts}; "
              f"a spare ready; job to agent built {med(startups):.3f} s)")
        print(f"harness process start  {med(c for _, c in usage):5.2f} CPU s (interpreter, imports and warm-up, "
              f"median of {len(usage)}); a ready spare holds {med(r for r, _ in usage):.0f} MB RSS")

        n, count = args.concurrency, args.concurrency * args.waves
        for lat in args.call_latency:
            latency["s"] = lat
            base = _in_worker_batch(harness, task, model, factory, count, n)

            async def steady() -> tuple[list[float], int]:
                ex = AgentExecutor(model=cfg, sandbox=sandbox, warm_processes="auto")
                try:
                    return await _boundary_batch(ex, harness, task, count, n, verdict.score)
                finally:
                    await ex.pool.aclose()

            times, found = asyncio.run(steady())
            # The first wave starts with an empty pool (every rollout cold): the steady state
            # is the rest, once the pool has seen n rollouts in flight.
            rest = times[n:]
            mb, ms = med(base), med(rest)
            p90 = sorted(rest)[int(0.9 * (len(rest) - 1))]
            print(f"steady state, {n} rollouts in flight on one worker, model calls of {lat:g} s: in-worker "
                  f"{mb:6.2f} s, harness process {ms:6.2f} s (p90 {p90:6.2f} s)   added {ms - mb:+7.2f} s per rollout  "
                  f"(median of {len(rest)} after the first {n}; {found} of {count} found a spare)")


# The client side of boundary_call_overhead, run in a process of its own as the harness
# process is: the chat model a harness gets (build_model, over the grant's socket, with
# the relay started as in a sandbox) against the solver's own chat model calling the
# scripted server directly, interleaved. CPU per call is this process's plus the gateway
# process's (read through its CPU clock; it also holds the scripted server). One JSON line
# of per-call samples on stdout.
_CALL_CLIENT = """
import asyncio, json, sys, time
from milo_ray.boundary.inside.backend import GatewayRelay
from milo_ray.boundary.inside.harness_process import build_model
from milo_ray.config.schemas import ModelConfig
from milo_ray.llm.client import build_chat_model

spec = json.loads(sys.argv[1])
direct = build_chat_model(ModelConfig(**spec["model"]).check(), rate_limiter=None)
relay = GatewayRelay(spec["socket"])
through = build_model({"model": {"solver": spec["model"]["solver"]}, "token": spec["token"]}, relay.url,
                      spec["socket"])
gateway_cpu = ((~spec["gateway_pid"]) << 3) | 2  # Linux: that process's CPU clock (CPUCLOCK_SCHED)
out = {k: {"wall": [], "client_cpu": [], "gateway_cpu": []} for k in ("direct", "through")}

async def main():
    for round_no in range(spec["n"] + 1):
        for name, m in (("direct", direct), ("through", through)):
            t, c, g = time.perf_counter(), time.process_time(), time.clock_gettime(gateway_cpu)
            await m.ainvoke("hi")
            if round_no:
                out[name]["wall"].append(time.perf_counter() - t)
                out[name]["client_cpu"].append(time.process_time() - c)
                out[name]["gateway_cpu"].append(time.clock_gettime(gateway_cpu) - g)

asyncio.run(main())
print(json.dumps(out))
"""


def boundary_call_overhead(args: argparse.Namespace) -> None:
    """What the gateway adds to one model call, as production runs it: the chat model a
    harness gets in its sandbox (``GatewayChatModel`` from ``build_model``, in a process
    of its own, over its rollout's own gateway socket) against the solver's own chat model
    calling the same local scripted server directly from that same process, interleaved,
    in the same run; and what a rollout pays once for its own socket."""
    import asyncio
    import json
    import os

    from milo_ray.boundary.gateway.server import ModelGateway
    from milo_ray.config.schemas import ModelConfig
    from milo_ray.testing.openai_server import ScriptedOpenAIServer, reply

    os.environ.setdefault("BENCH_SOLVER_KEY", "local")
    med = lambda xs: statistics.median(list(xs)) * 1000  # noqa: E731  (ms)
    with ScriptedOpenAIServer(lambda body: reply("ok", prompt_tokens=1, completion_tokens=1)) as srv:
        fields = {"solver": "openai/scripted", "api_base": srv.url, "api_key_env": "BENCH_SOLVER_KEY",
                  "max_retries": 0}
        model = ModelConfig(**fields).check()

        async def per_call() -> tuple[dict, float]:
            gw = ModelGateway(model, Path(tempfile.mkdtemp(prefix="milo-bench-gw-")) / "gw.sock")
            gw.set_key("local")
            await gw.start()
            bound = await gw.issue_bound("bench")  # the rollout's own socket, as a sandbox gets it
            spec = {"model": fields, "socket": bound.socket_path, "token": bound.token, "n": args.n,
                    "gateway_pid": os.getpid()}
            client = await asyncio.create_subprocess_exec(sys.executable, "-c", _CALL_CLIENT, json.dumps(spec),
                                                          stdout=subprocess.PIPE)
            stdout, _ = await client.communicate()
            if client.returncode:
                raise RuntimeError(f"the client process exited {client.returncode}")
            # What a rollout pays for its own socket: made at its start, closed at its end.
            sockets = []
            for _ in range(args.n):
                t = time.perf_counter()
                gw.end(await gw.issue_bound("bench"))
                sockets.append(time.perf_counter() - t)
            await gw.close()
            return json.loads(stdout), med(sockets)

        samples, sock_ms = asyncio.run(per_call())
    print(f"model call overhead: load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} on "
          f"{os.cpu_count()} CPUs; medians of {args.n} calls of each, interleaved, in this run; the client in a "
          "process of its own, the gateway and the scripted server in the bench's process")
    for name in ("direct", "through"):
        s = samples[name]
        s["cpu"] = [c + g for c, g in zip(s["client_cpu"], s["gateway_cpu"])]
    d, t = samples["direct"], samples["through"]
    for what, key in (("wall time", "wall"), ("CPU time (client + gateway processes)", "cpu"),
                      ("  of it the client process", "client_cpu"), ("  of it the gateway process", "gateway_cpu")):
        a, b = med(d[key]), med(t[key])
        print(f"  {what:40s} direct {a:7.3f} ms   through the gateway {b:7.3f} ms   added {b - a:+7.3f} ms per call"
              + (f", {b / a:.3f}x the direct call" if key in ("wall", "cpu") else ""))
    print(f"a rollout's own gateway socket: {sock_ms:.3f} ms to open and close (median of {args.n}; once "
          "per rollout)")


def task_spec(task):
    from milo_ray.core.tasks import format_of

    return format_of(task).sandbox_spec(task)


# The measurements main() runs, in order; each takes the parsed arguments.
SECTIONS: tuple[Callable[[argparse.Namespace], None], ...] = (command_overhead, boundary_overhead,
                                                              boundary_call_overhead, suite_throughput)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=50, help="runs per command and backend (median reported)")
    parser.add_argument("--slots", type=int, nargs="+", default=[1, 8, 32],
                        help="concurrent rollout slots of the suite throughput runs (the first is the baseline)")
    parser.add_argument("--rollouts-per-task", type=int, default=2, help="rollouts of each bundled task per run")
    parser.add_argument("--rollouts", type=int, default=5, help="rollouts per path of the boundary overhead (median)")
    parser.add_argument("--concurrency", type=int, default=8,
                        help="rollouts in flight on one worker in the boundary's steady state")
    parser.add_argument("--waves", type=int, default=4, help="steady state: rollouts = concurrency x waves")
    parser.add_argument("--call-latency", type=float, nargs="+", default=[0.0, 2.0],
                        help="seconds the scripted model takes per call in the steady state runs")
    parser.add_argument("--only", default="", help="run only the sections whose name contains this text")
    args = parser.parse_args(argv)
    if args.n < 1:
        parser.error("--n must be >= 1")
    for section in SECTIONS:
        if args.only in section.__name__:
            section(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
