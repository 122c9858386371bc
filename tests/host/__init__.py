"""The host tests: real processes and real torch.distributed on this machine, no Docker.

A package (its modules import as host.test_strategy and so on) so that a file here can keep the name
of the tests/unit file it was split from: pytest's default import mode imports a test file outside a
package by its bare name, and refuses a second test_strategy.py in the same session."""
