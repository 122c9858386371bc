"""The network between nodes: tc commands built as data (tc), applied and read back (apply), faults."""
