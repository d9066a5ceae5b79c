"""``xla-migrate verify``: run a migrated script on torch_xla and check it."""
