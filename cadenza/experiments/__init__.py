"""Reproducible studies built on the library (e.g. tool hints)."""
