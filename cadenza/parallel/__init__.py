"""ParallelDims, dual meshes, FSDP2, expert and context parallelism."""
