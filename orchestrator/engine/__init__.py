"""Making it happen: the sweep engine, SSH execution and bootstrap, progress, cleanup."""
