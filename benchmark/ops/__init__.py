"""Operator benchmarks: shared shapes in config.py, shared helpers in bench_utils.py."""
