"""Newton-Schulz, granular Muon and its sharded runtime."""
