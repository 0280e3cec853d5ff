"""Memory-tier peers from the job's Topology: a node's second copy goes to a node that shares no
parallel group (TP, PP, DP, ...) with any of its ranks, and the agent's memory URI names that peer."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from stalwart.agents.data_plane import memory_peer, memory_uri
from stalwart.checkpoint.peers import choose_peers
from stalwart.checkpoint.storage import open_storage
from stalwart.checkpoint.storage.memory import MemoryStorage
from stalwart.spec import Parallelism, Role, TrainingJobSpec
from stalwart.spec.topology import Topology
from stalwart.store.records import Assignment, NodeAssignment


def topology(replicas: int, procs: int, **parallelism: int) -> Topology:
    role = Role(
        name="t", replicas=replicas, processes_per_node=procs, command=["x"], parallelism=Parallelism(**parallelism)
    )
    return Topology.from_spec(TrainingJobSpec(roles=[role]), {r: f"node-{r // procs}" for r in range(replicas * procs)})


def shares_a_group(t: Topology, a: str, b: str) -> bool:
    return any(set(g) & set(t.ranks_on(a)) and set(g) & set(t.ranks_on(b)) for g in t.parallel_groups())


def test_peers_share_no_parallel_group_with_their_node() -> None:
    for t in (
        topology(4, 2, tensor=2, pipeline=2),
        topology(8, 2, tensor=2, pipeline=2),
        topology(8, 2, tensor=2, pipeline=4),
    ):
        peers = choose_peers(t.rank_nodes, t.parallel_groups())
        assert set(peers) == set(t.nodes())
        for node, peer in peers.items():
            assert not shares_a_group(t, node, peer), (t.describe(), node, peer)
    t = topology(4, 2, tensor=2, pipeline=2)
    example = choose_peers(t.rank_nodes, t.parallel_groups())
    assert example == {"node-0": "node-3", "node-1": "node-2", "node-2": "node-1", "node-3": "node-0"}


def test_the_agents_memory_uri_names_the_peer_outside_its_groups() -> None:
    t = topology(4, 2, tensor=2, pipeline=2)
    nodes = [
        NodeAssignment(node=f"node-{i}", node_rank=i, role="t", first_rank=2 * i, local_world_size=2) for i in range(4)
    ]
    assignment = Assignment(
        job="j", generation=1, world_size=8, master_addr="h", master_port=1, nodes=nodes, created_at=0.0
    )
    for i, entry in enumerate(assignment.nodes):
        entry.memory = f"127.0.0.1:{7000 + i}"
    assignment = Assignment.loads(assignment.dumps())  # as the agent reads it from etcd
    uri = memory_uri("node-1", "j", assignment, memory_peer("node-1", t), assignment.memory_stores())
    assert uri == "mem://127.0.0.1:7001/j?peer=127.0.0.1:7002&nodes=127.0.0.1:7000,127.0.0.1:7002,127.0.0.1:7003"


def test_a_long_store_list_goes_to_a_file_the_storage_reads(tmp_path: Path) -> None:
    """At thousands of nodes the list of every node's store is longer than one environment variable
    may be (128 KiB): the URI names a file beside the job instead, and open_storage reads it."""
    count = 2_000
    nodes = [
        NodeAssignment(node=f"node-{i}", node_rank=i, role="t", first_rank=i, local_world_size=1) for i in range(count)
    ]
    assignment = Assignment(
        job="j", generation=3, world_size=count, master_addr="h", master_port=1, nodes=nodes, created_at=0.0
    )
    stores = {n.node: f"10.0.{i // 250}.{i % 250}:7000" for i, n in enumerate(nodes)}
    t = topology(count, 1)
    uri = memory_uri("node-1", "j", assignment, memory_peer("node-1", t), stores, spill_dir=tmp_path)
    assert uri is not None and len(uri) < 200 and "nodes_file=" in uri and "nodes=" not in uri
    storage = open_storage(uri)
    assert isinstance(storage, MemoryStorage)
    assert {e.address for e in storage.readers} == set(stores.values())
    small = memory_uri(
        "node-1",
        "j",
        assignment.model_copy(update={"nodes": nodes[:4]}),
        memory_peer("node-1", topology(4, 1)),
        stores,
        spill_dir=tmp_path,
    )
    assert small is not None and "nodes=10.0.0.0:7000,10.0.0.2:7000,10.0.0.3:7000" in small


def test_peers_for_thousands_of_nodes_share_no_group_and_spread_evenly() -> None:
    """Every agent computes the peers of the whole job at each generation start: at 2,500 nodes x 8
    ranks (TP=8 in a node, PP=4, DP=625) this must stay cheap (it was quadratic: minutes at 10,000
    nodes). Every peer is outside its node's groups, and no node holds more than two copies."""
    t = topology(2_500, 8, tensor=8, pipeline=4)
    peers = choose_peers(t.rank_nodes, t.parallel_groups())
    assert len(peers) == 2_500
    groups_of: dict[str, set[int]] = {}
    for g, group in enumerate(t.parallel_groups()):
        for r in group:
            groups_of.setdefault(t.rank_nodes[r], set()).add(g)
    assert all(not (groups_of[node] & groups_of[peer]) for node, peer in peers.items())
    assert max(Counter(peers.values()).values()) <= 2
