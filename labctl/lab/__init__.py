"""The lab itself on the engine: its Compose document and env files, each node's GPUs, the nodes' TCP
congestion control, bring-up (`up`'s plan and its application) and teardown, every lab on the engine
and its owner, and `gc`. The images the nodes run come from labctl.image, below it."""
