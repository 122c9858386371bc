"""labctl: drive a multi-node PyTorch DDP lab in Docker Compose (README.md; the documentation in docs/)."""

__version__ = "0.1.0"
