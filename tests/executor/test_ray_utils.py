"""ray_utils (pagedllm/executor/ray_utils.py) without a cluster: the device check against
ray.nodes()-shaped node lists, and local ranks from the nodes of a placement group's bundles.
Reference: their rules, by hand."""

import pytest

from pagedllm.executor.ray_utils import check_devices, local_ranks


def node(node_id: str, cpus: float, alive: bool = True) -> dict:
    return {"NodeID": node_id, "Alive": alive, "Resources": {"CPU": cpus}}


def test_enough_devices_with_one_on_the_driver_node_pass() -> None:
    check_devices([node("a", 1), node("b", 1)], "a", "CPU", 2)


@pytest.mark.parametrize(
    "nodes, error",
    [
        ([node("a", 1), node("b", 1)], "has 2 CPU, but 3 ranks need one each"),
        ([node("a", 1), node("b", 4, alive=False)], "has 1 CPU, but 3 ranks"),
        ([node("a", 0), node("b", 4)], "the engine's Ray node has no CPU for rank 0"),
        ([node("b", 4)], "the engine's Ray node has no CPU"),
    ],
)
def test_missing_devices_are_refused(nodes: list[dict], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        check_devices(nodes, "a", "CPU", 3)


def test_local_ranks_count_the_ranks_of_each_node() -> None:
    """Bundles on nodes a, a, b, a: ranks 0, 1, 3 are a's (local 0, 1, 2 of 3), 2 is b's."""
    assert local_ranks(["a", "a", "b", "a"]) == [(0, 3), (1, 3), (0, 1), (2, 3)]
