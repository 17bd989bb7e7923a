"""Ray for the "ray" executor backend (vLLM's ray_utils): joining a cluster or starting one,
and the placement group that reserves one device per rank, rank 0's on the driver's node.

Ray is an optional extra (`pip install "pagedllm[ray]"`); it is imported only here and only
when the backend is asked for.
"""

import os
from types import ModuleType
from typing import Any

PLACEMENT_GROUP_TIMEOUT_S = 120.0  # the cluster has the resources (checked first) but is busy


def import_ray() -> ModuleType:
    try:
        import ray
    except ImportError as e:
        raise ImportError(
            'distributed_executor_backend "ray" needs Ray: pip install "pagedllm[ray]"'
        ) from e
    return ray


def connect_to_cluster(world_size: int) -> bool:
    """Join the cluster at RAY_ADDRESS, else the one `ray start` runs on this machine, else
    start a local one. True when this call initialised Ray (the executor then shuts it down);
    False when the process was connected already."""
    ray = import_ray()
    if ray.is_initialized():
        return False
    address = os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address)
        return True
    try:
        ray.init(address="auto")
    except ConnectionError:
        # A local cluster: one CPU bundle per rank, even where ranks outnumber the cores
        # (a rank's threads take its share of the cores, see worker.rank_device).
        ray.init(num_cpus=max(os.cpu_count() or 1, world_size), include_dashboard=False)
    return True


def driver_node() -> tuple[str, str]:
    """(node id, IP) of the node this process runs on."""
    ray = import_ray()
    node_id = ray.get_runtime_context().get_node_id()
    for node in ray.nodes():
        if node["NodeID"] == node_id:
            return node_id, node["NodeManagerAddress"]
    raise RuntimeError(f"this process's Ray node {node_id} is not in the cluster's node list")


def check_devices(
    nodes: list[dict[str, Any]], driver_id: str, device_key: str, world_size: int
) -> None:
    """ValueError unless the live nodes (ray.nodes()) hold a `device_key` per rank, one of
    them on the driver's node (rank 0 runs there)."""
    alive = [node for node in nodes if node.get("Alive", True)]
    total = sum(node["Resources"].get(device_key, 0) for node in alive)
    if total < world_size:
        raise ValueError(
            f"the Ray cluster has {total:g} {device_key}, but {world_size} ranks need one each"
        )
    driver = [node for node in alive if node["NodeID"] == driver_id]
    if not driver or driver[0]["Resources"].get(device_key, 0) < 1:
        raise ValueError(
            f"the engine's Ray node has no {device_key} for rank 0, which runs in the engine's "
            "process: start the engine on a node that has one"
        )


def create_placement_group(world_size: int, device_key: str, driver: tuple[str, str]) -> Any:
    """One bundle of `device_key` ("CPU" or "GPU") per rank, packed onto as few nodes as
    possible, bundle 0 (rank 0, this process) on the driver's node (id, IP). Raises if the
    cluster lacks the devices, or cannot place the group within PLACEMENT_GROUP_TIMEOUT_S."""
    ray = import_ray()
    check_devices(ray.nodes(), driver[0], device_key, world_size)
    driver_ip = driver[1]
    bundles: list[dict[str, float]] = [{device_key: 1.0} for _ in range(world_size)]
    bundles[0][f"node:{driver_ip}"] = 0.001  # vLLM's way to pin a bundle to a node
    group = ray.util.placement_group(bundles, strategy="PACK")
    ready, _ = ray.wait([group.ready()], timeout=PLACEMENT_GROUP_TIMEOUT_S)
    if not ready:
        ray.util.remove_placement_group(group)
        raise RuntimeError(
            f"Ray could not place {world_size} bundles of 1 {device_key} (the first on "
            f"{driver_ip}) within {PLACEMENT_GROUP_TIMEOUT_S:.0f} s; available: "
            f"{ray.available_resources()}"
        )
    return group


def bundle_nodes(group: Any) -> list[str]:
    """The node id holding each bundle of a placed group."""
    ray = import_ray()
    placed = ray.util.placement_group_table(group)["bundles_to_node_id"]
    return [placed[i] for i in range(len(placed))]


def local_ranks(nodes: list[str]) -> list[tuple[int, int]]:
    """(local rank, ranks on its node) of each rank, given each rank's node."""
    return [(nodes[:rank].count(node), nodes.count(node)) for rank, node in enumerate(nodes)]
