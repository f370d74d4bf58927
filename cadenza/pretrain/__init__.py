"""Continued pretraining of HF causal LMs on the dual mesh (``cadenza pretrain CONFIG.toml``)."""
