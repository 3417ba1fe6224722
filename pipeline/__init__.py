"""The driver: config, shard planning, the actor pool, the commit protocol and the job summary."""
