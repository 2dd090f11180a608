"""The lines a rank prints when it loses a peer or when a rank straggles (pure functions, real gloo text)."""

from trainer.resilience import is_comm_failure, lost_peer_line, stragglers

PEERS = [{"rank": r, "host": f"node{r}", "addr": f"10.77.2.1{r}"} for r in range(3)]
# as torch 2.13 raised it in a DDP backward when the peer's process was SIGKILLed
RESET = RuntimeError(
    "Got the following error when running the callback: RuntimeError: Got the following error when running "
    "the callback: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read "
    "error [10.77.2.12]:18637: Connection reset by peer. This is typically caused by a remote worker hanging "
    "or bugs in the application. Check the logs of the remote worker before reporting an error. GLHF!\n"
    "\nAt:\n"
    "  x.py(1)")
TIMEOUT = RuntimeError("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
                       "45000ms for recv operation to complete")


def test_the_address_in_gloos_message_names_the_peer():
    line = lost_peer_line(RESET, 0, PEERS)
    assert line == ("lost peer rank 2 (node2 10.77.2.12): Read error [10.77.2.12]:18637: Connection reset by "
                    "peer; see its log")
    assert is_comm_failure(RESET) and is_comm_failure(TIMEOUT)
    assert not is_comm_failure(RuntimeError("loss is nan at step 3; lower --lr"))


def test_a_silent_peer_is_the_other_rank_of_two_or_one_of_the_rest():
    assert lost_peer_line(TIMEOUT, 1, PEERS[:2]).startswith("lost peer rank 0 (node0 10.77.2.10): Timed out")
    line = lost_peer_line(TIMEOUT, 0, PEERS)
    assert line.startswith("lost a peer, one of rank 1 (node1 10.77.2.11), rank 2 (node2 10.77.2.12): Timed")
    setup = lost_peer_line(TIMEOUT, 1, [], master="10.77.2.10:29500")
    assert setup.startswith("lost contact with the other ranks during setup (master 10.77.2.10:29500)")


def test_straggler_is_a_rank_far_above_the_others_median():
    assert stragglers([40.0, 42.0, 130.0], 2.0) == {2: 130.0 / 41.0}
    assert stragglers([40.0, 60.0], 2.0) == {}
    assert set(stragglers([10.0, 35.0], 2.0)) == {1}
