"""Real machines over SSH: the inventory, the SSH transport, the lab's nodes as SSH hosts, and check/sync/run."""
