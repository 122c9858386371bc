"""The lab on the engine: Compose document, env files, the node image and its wheelhouse, the engine, bring-up and teardown."""
