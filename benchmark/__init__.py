"""Benchmarks of Primus-Turbo (see benchmark/README.md)."""
