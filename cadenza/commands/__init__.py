"""CLI command groups, one module per group, each exposing ``register(app)``."""
