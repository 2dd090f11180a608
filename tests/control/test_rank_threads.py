"""ddplab/rank_threads.py: torch threads per rank, with the CPUs of a machine shared by the hosts on it."""

from ddplab.rank_threads import rank_threads

BOX, OTHER = "boot-id-of-the-box", "boot-id-of-another-machine"


def node(ranks: int, cpus: list[int], machine: str = BOX) -> dict:
    return {"ranks": ranks, "cpus": cpus, "machine": machine}


def test_a_set_value_wins():
    assert rank_threads("a", {"a": node(1, [0, 1, 2, 3])}, threads=3) == 3


def test_machines_of_their_own_divide_their_cpus_by_their_own_ranks():
    nodes = {"desktop": node(2, list(range(8))), "laptop": node(1, [0, 1, 2, 3], OTHER)}
    assert rank_threads("desktop", nodes) == 4 and rank_threads("laptop", nodes) == 4


def test_hosts_of_one_machine_share_its_cpus():
    # the local inventory, or simulated hosts that are not pinned: each sees the machine's 2 CPUs
    nodes = {"local0": node(1, [0, 1]), "local1": node(1, [0, 1])}
    assert rank_threads("local0", nodes) == rank_threads("local1", nodes) == 1
    nodes = {"a": node(1, list(range(8))), "b": node(1, list(range(8)))}
    assert rank_threads("a", nodes) == 4
    nodes = {"a": node(2, [0, 1]), "b": node(1, [0, 1])}  # 3 ranks on 2 CPUs: at least one thread each
    assert rank_threads("a", nodes) == rank_threads("b", nodes) == 1


def test_hosts_pinned_to_their_own_cpus_of_one_machine_do_not_share():
    nodes = {"a": node(1, [0, 1]), "b": node(1, [2, 3]), "c": node(2, [4, 5, 6, 7])}
    assert [rank_threads(h, nodes) for h in "abc"] == [2, 2, 2]


def test_an_unknown_machine_shares_with_no_one():
    nodes = {"a": node(1, [0, 1], machine=""), "b": node(1, [0, 1], machine="")}
    assert rank_threads("a", nodes) == 2


def test_no_cpu_set_gives_one_thread():
    assert rank_threads("a", {"a": node(1, [])}) == 1
