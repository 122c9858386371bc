"""labctl: drive a multi-node PyTorch DDP lab in Docker Compose (see README.md)."""

__version__ = "0.1.0"
