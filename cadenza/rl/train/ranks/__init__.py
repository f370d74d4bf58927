"""The trainer over several ranks: data parallelism (replicated weights), sharding on the dual mesh
(FSDP2, EP, CP) and engine syncs streamed from the shards."""
