"""ParallelDims, dual meshes, FSDP2, expert and context parallelism."""

from cadenza.parallel.dims import Meshes, ParallelDims, build_meshes
from cadenza.parallel.parallelize import ParallelCausalLM, ParallelOptions, parallelize

__all__ = ["Meshes", "ParallelCausalLM", "ParallelDims", "ParallelOptions", "build_meshes", "parallelize"]
