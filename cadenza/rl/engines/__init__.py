"""Rollout engines behind the :class:`~cadenza.rl.engines.engine.RolloutEngine` seam: ``hf``, ``vllm``,
``openai``.

:func:`make_engine` builds one by name; vLLM and its HTTP client are imported only when asked for, so
``hf`` works without the optional ``vllm`` extra (``python -m cadenza.rl.engines.install``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cadenza.errors import ConfigError

# no torch at import (engine.py imports it): the vLLM server's supervisor, ``python -m
# cadenza.rl.engines.vllm_server``, loads this package and starts 3-7 s sooner without it
if TYPE_CHECKING:
    from cadenza.rl.engines.engine import RolloutEngine


def make_engine(name: str, **options: Any) -> RolloutEngine:
    """Build an engine by name.

    - ``hf``: ``policy=HFPolicy`` (the engine samples with its own copy of the model).
    - ``vllm``: ``model=path`` plus any :class:`VLLMServerConfig` field (``port``, ``max_model_len``,
      ``kv_cache_gib``, ``log_path``, …) and any :class:`VLLMEngineConfig` field (``request_timeout_s``,
      ``sync_timeout_s``, ``bucket_bytes``, ``transport``, …). Starts the server and waits for health.
    - ``openai``: ``base_url=`` plus any :class:`OpenAIEngineConfig` field.
    """
    if name == "hf":
        from cadenza.rl.engines.hf import HFEngine

        if "policy" not in options:
            raise ConfigError("engine 'hf' needs policy=HFPolicy(...)")
        return HFEngine(options.pop("policy"), **options)
    if name == "vllm":
        import dataclasses

        from cadenza.rl.engines.vllm import VLLMEngine, VLLMEngineConfig
        from cadenza.rl.engines.vllm_server import VLLMServerConfig

        server_keys = {f.name for f in dataclasses.fields(VLLMServerConfig)}
        engine_keys = {f.name for f in dataclasses.fields(VLLMEngineConfig)} - {"server"}
        unknown = set(options) - server_keys - engine_keys - {"version"}
        if unknown:
            raise ConfigError(f"unknown vllm engine option(s): {', '.join(sorted(unknown))}")
        if "model" not in options:
            raise ConfigError("engine 'vllm' needs model=<local HF directory>")
        server = VLLMServerConfig(**{k: v for k, v in options.items() if k in server_keys})
        cfg = VLLMEngineConfig(server=server, **{k: v for k, v in options.items() if k in engine_keys})
        return VLLMEngine(cfg, version=int(options.get("version", 0)))
    if name == "openai":
        from cadenza.rl.engines.openai import OpenAIEngine, OpenAIEngineConfig

        return OpenAIEngine(OpenAIEngineConfig(**options))
    from cadenza.rl.engines.engine import ENGINES

    raise ConfigError(f"unknown engine {name!r}; choose one of {', '.join(ENGINES)}")


__all__ = ["make_engine"]
