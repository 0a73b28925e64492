"""Islands as Ray actors (milo_ray.milo.island_actor): an actor answers exactly as the
plain Island given the same events; a question sees every event handed over before it
(hand-overs are batched into the next call); a failed hand-over is raised at the next
question; the run-level state keeps no copy of an island, which is rebuilt from its
events; two islands on a two-node cluster land on
different nodes."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap

import pytest

from milo_helpers import node
from milo_ray.milo.events import HeldOut, NodeRecorded, Progress
from milo_ray.milo.island import Island
from milo_ray.milo.island_actor import IslandRef, ask, island_actors
from milo_ray.milo.lineage import LineageNode
from milo_ray.milo.state import MiloState
from milo_ray.testing.processes import last_json
from milo_ray.milo.events import decode
from test_state import stored_sequence


def _states() -> tuple[MiloState, MiloState]:
    """The same stored events (two islands, a speciation, a curriculum re-fit, ...)
    projected onto plain islands and onto island actors."""
    plain, actors = MiloState(), MiloState(island_factory=island_actors(eps=0.02, temperature=1.0))
    for kind, payload in stored_sequence():
        plain.apply(decode(kind, payload))
        actors.apply(decode(kind, payload))
    return plain, actors


def _answers(state: MiloState) -> dict:
    async def go():
        out = {}
        for j, isl in sorted(state.islands.items()):
            out[j] = (await ask(isl, Island.plan, 7, "softmax", "lineage", "bold"),
                      await ask(isl, Island.judge, [0.56, 0.99, 0.9]),
                      await ask(isl, Island.view, 5, "bold"),
                      await ask(isl, Island.refit_due, 0),
                      await ask(isl, Island.speciation_root, "0-2"))
        return out

    return asyncio.run(go())


def test_an_island_actor_answers_as_the_plain_island_given_the_same_events(ray_local):
    plain, actors = _states()
    assert all(isinstance(isl, IslandRef) for isl in actors.islands.values()) and set(actors.islands) == {0, 1, 2}
    assert actors.snapshot() == plain.snapshot()
    assert _answers(actors) == _answers(plain)
    assert actors.recorded == plain.recorded and actors.val_gain == plain.val_gain
    assert actors.progress == plain.progress == {0: (1, 1), 1: (1, 0), 2: (0, 0)}


def _seeded(ref: IslandRef | Island) -> None:
    ref.apply(NodeRecorded(LineageNode.from_dict(node("s0", acc=0.5))))
    ref.apply(HeldOut(0, "s0", 0.4))
    ref.apply(Progress(0, 1, 0))


def test_a_question_sees_every_event_handed_over_before_it_in_one_call(ray_local):
    ref = island_actors(eps=0.02, temperature=1.0)(0)
    _seeded(ref)
    assert len(ref._unsent) == 3  # nothing sent yet: the next question carries them

    async def go():
        return (await ask(ref, Island.find, "hs0"), await ask(ref, Island.held_out_gain, "s0"),
                await ask(ref, Island.status))

    assert asyncio.run(go()) == ("s0", True, (1, 0))
    assert ref._unsent == [] and ref._sent == []
    ref.apply(Progress(0, 2, 1))
    assert (ref.rounds_done, ref.stall) == (2, 1)  # the blocking readers send first, too


def test_a_failed_hand_over_is_raised_at_the_next_question(ray_local):
    ref = island_actors(eps=0.02, temperature=1.0)(0)
    ref.apply(HeldOut(0, "no-such-node", 0.4))  # the island holds no such node
    with pytest.raises(KeyError, match="no-such-node"):
        asyncio.run(ask(ref, Island.status))
    assert ref.status() == (0, 0)  # raised once; the actor still answers


def _island_values(state: MiloState) -> list:
    """Every LineageNode (or dict of one) reachable from the state's own attributes,
    islands excluded."""
    found, todo = [], [v for k, v in vars(state).items() if k != "islands"]
    while todo:
        v = todo.pop()
        if isinstance(v, LineageNode) or (isinstance(v, dict) and "node_id" in v and "fitness" in v):
            found.append(v)
        elif isinstance(v, dict):
            todo += list(v.keys()) + list(v.values())
        elif isinstance(v, (list, tuple, set)):
            todo += list(v)
    return found


def test_the_run_state_keeps_no_copy_of_an_island_and_its_events_rebuild_it(ray_local):
    plain, actors = _states()
    assert _island_values(actors) == []
    assert _island_values(plain) == []  # the same class: nothing of an island outside it
    before = actors.snapshot()
    actors.islands[2].kill()  # as its node leaving would
    assert actors.snapshot() == before  # its handle started a new actor and replayed the changes it sent
    _, rebuilt = _states()  # a resumed run: new actors, each rebuilt from its island's events
    assert rebuilt.snapshot() == before


CLUSTER_SCRIPT = textwrap.dedent("""
    import json, ray
    from ray._private import state
    from ray.cluster_utils import Cluster
    from milo_ray.milo.island_actor import island_actors
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    ray.init(address=cluster.address, log_to_driver=False)
    cluster.wait_for_nodes()
    # A node is registered before the driver's raylet can place work on it (a soft
    # placement then falls back): wait until a task pinned to each node has run there.
    ping = ray.remote(num_cpus=0)(lambda: ray.get_runtime_context().get_node_id())
    alive = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    assert ray.get([ping.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote()
                    for n in alive]) == alive
    make = island_actors(eps=0.02, temperature=1.0)
    refs = [make(j) for j in range(2)]
    assert [r.status() for r in refs] == [(0, 0), (0, 0)]  # both alive and answering
    nodes = [state.actors(r.actor._actor_id.hex())["Address"]["NodeID"] for r in refs]
    print(json.dumps({"islands": nodes, "cluster": [n["NodeID"] for n in ray.nodes() if n["Alive"]]}))
    ray.shutdown()
    cluster.shutdown()
""")


@pytest.mark.slow  # starts a two-node cluster (~20-30 s here)
def test_two_islands_land_on_different_nodes_of_a_two_node_cluster(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out = subprocess.run([sys.executable, "-c", CLUSTER_SCRIPT], env=env, capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    placed = last_json(out.stdout)
    assert len(placed["cluster"]) == 2
    assert set(placed["islands"]) == set(placed["cluster"])
