"""`python -m ddplab status` for an elastic run: nodes that went away, the membership history."""

from ddplab import status


def state(step, membership=()):
    return {"state": "exited", "code": 0, "step": step, "last_line": "done", "membership": list(membership)}


HISTORY = [
    {"time": 0, "nodes": ["node0", "node1", "node2"], "resumed_step": 0, "lost_steps": 0},
    {"time": 60, "nodes": ["node0", "node2"], "resumed_step": 1700, "lost_steps": 73},
    {"time": 90, "nodes": ["node0", "node1", "node2"], "resumed_step": 5500, "lost_steps": 37},
    {"time": 120, "nodes": ["node1", "node2"], "resumed_step": 8000, "lost_steps": 0},
]


def judge(lost, history):
    nodes = {"node0": 0, "node1": 1, "node2": 2}
    asked = [h for h in nodes if h not in lost]
    states = {h: state(9000, history if h == "node2" else history[:1]) for h in asked}
    return status.judge({"run": "r", "nodes": nodes, "asked": asked, "states": states, "lost": lost})


def test_a_node_that_went_away_did_not_fail_the_run_and_one_that_came_back_says_so():
    out = judge(["node0", "node1"], HISTORY)
    rows = {r["host"]: r for r in out["nodes"]}
    assert out["failed"] == [] and out["failed_first"] is None
    assert rows["node0"]["verdict"] == status.LEFT  # gone for good: not in the last group
    assert rows["node1"]["verdict"] == status.REJOINED  # gone, then in the last group again
    assert rows["node2"]["verdict"] == "finished"
    assert out["lost"] == ["node0", "node1"]


def test_the_membership_history_names_who_left_and_who_joined_and_the_steps_lost():
    lines = judge(["node0"], HISTORY)["lines"]
    start = lines.index("membership (elastic run):")
    hist = lines[start + 1:]
    assert len(hist) == 4
    assert hist[0].endswith("3 node(s) (node0, node1, node2); from step 0")
    assert hist[1].endswith("2 node(s) (node0, node2), node1 left; from step 1700, 73 steps lost")
    assert hist[2].endswith("3 node(s) (node0, node1, node2), node1 joined; from step 5500, 37 steps lost")
    assert hist[3].endswith("2 node(s) (node1, node2), node0 left; from step 8000")


def test_a_run_that_is_not_elastic_prints_no_membership():
    lines = judge([], [])["lines"]
    assert "membership (elastic run):" not in lines
