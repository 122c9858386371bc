"""The link's probes kept once for each state of the lab's links (trainer/linkstate.py): what a state
is, and that a kept file is read back whole or measured again. A real lab's runs: test_training.py."""

import json

from trainer import linkstate

NODE = {"host": "node0", "ip": "172.28.0.10", "shaping": {}, "quota": None, "local_ranks": 1, "started": "1234"}


def test_a_state_is_every_ranks_node_as_it_reported_itself_and_the_backend():
    one = [NODE, {**NODE, "host": "node1", "ip": "172.28.0.11"}]
    key = linkstate.state_key(one, "gloo")
    assert key == linkstate.state_key([dict(m) for m in one], "gloo") and len(key) == 16
    changed = [
        [{**one[0], "shaping": {"egress": {"rate_bps": 1e9, "burst_bytes": 131072.0}}}, one[1]],  # shape
        [one[0], {**one[1], "quota": 0.5}],  # slow node1
        [one[0], {**one[1], "started": "9999"}],  # node1 made anew (up, a restart)
        [{**m, "iface": "tailscale0"} for m in one],  # the same nodes, over an overlay's tunnel
        [one[0], {**one[1], "ip": "172.28.0.12"}],  # another node
        one + [{**NODE, "host": "node2", "ip": "172.28.0.12"}],  # up with more nodes
    ]
    assert len({key} | {linkstate.state_key(state, "gloo") for state in changed}) == 1 + len(changed)
    assert linkstate.state_key(one, "nccl") != key
    # a ring that meets a shaped hop probes no rate; one turning the other way on the same links may
    assert linkstate.state_key(one, "gloo", shaped=True) != key


def test_a_kept_state_reads_back_and_anything_else_is_measured_again(tmp_path):
    record = {"format": linkstate.FORMAT, "key": "k", "small_s": [0.001, 0.002], "big_s": None}
    linkstate.keep(str(tmp_path / "links"), "k", record)
    assert linkstate.read_kept(str(tmp_path / "links"), "k") == record
    assert [p.name for p in (tmp_path / "links").iterdir()] == ["k.json"]  # no temporary left
    assert linkstate.read_kept(str(tmp_path / "links"), "other") is None
    for text in ("{half", json.dumps({**record, "format": linkstate.FORMAT + 1}), json.dumps({**record, "small_s": []}),
                 "[1, 2]"):
        (tmp_path / "links" / "k.json").write_text(text)
        assert linkstate.read_kept(str(tmp_path / "links"), "k") is None, text
    (tmp_path / "file").write_text("")  # a folder that cannot be made: nothing kept, and no error
    linkstate.keep(str(tmp_path / "file" / "links"), "k", record)
    assert (tmp_path / "file").read_text() == ""
