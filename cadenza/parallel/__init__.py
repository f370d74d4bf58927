"""ParallelDims, dual meshes, FSDP2, expert and context parallelism.

The names are loaded on first use (PEP 562): a config that only needs :class:`ParallelDims` (``cadenza
train``'s validation, which must answer a bad flag in one line before any heavy import) does not import
torch's distributed stack through :mod:`parallelize`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cadenza.lazy import lazy_package

if TYPE_CHECKING:
    from cadenza.parallel.dims import Meshes, ParallelDims, build_meshes
    from cadenza.parallel.parallelize import ParallelCausalLM, ParallelOptions, parallelize

_HOME = {
    "Meshes": "dims",
    "ParallelDims": "dims",
    "build_meshes": "dims",
    "ParallelCausalLM": "parallelize",
    "ParallelOptions": "parallelize",
    "parallelize": "parallelize",
}

__all__ = ["Meshes", "ParallelCausalLM", "ParallelDims", "ParallelOptions", "build_meshes", "parallelize"]


lazy_package(__name__, _HOME)
