"""The link counters the trainer reads (trainer/wire.py): every interface but lo, each node once."""

from trainer.wire import per_node_per_step, tx_bytes


def test_every_interface_but_the_loopback_counts(tmp_path):
    for iface, sent in (("lo", 999), ("eth0", 1000), ("eth1", 24)):
        (tmp_path / iface / "statistics").mkdir(parents=True)
        (tmp_path / iface / "statistics" / "tx_bytes").write_text(f"{sent}\n")
    assert tx_bytes(tmp_path) == 1024
    assert tx_bytes(tmp_path / "absent") is None  # no counters: nothing to say


def test_ranks_on_one_node_share_its_counters_and_it_counts_once():
    sent = [("node0", 600), ("node0", 600), ("node1", 400), ("node1", 400)]  # 2 ranks a node
    assert per_node_per_step(sent, steps=10) == 50.0
    assert per_node_per_step([("node0", None), ("node1", 400)], 10) is None
    assert per_node_per_step(sent, steps=0) is None
