"""Every benchmark results CSV says when and from which code it was measured: ``write_csv`` appends
Date and Commit columns unless the benchmark wrote its own."""

import csv
import importlib.util
import sys
from pathlib import Path

_UTILS = Path(__file__).resolve().parents[2] / "benchmark" / "ops" / "bench_utils.py"


def _utils():
    spec = importlib.util.spec_from_file_location("bench_utils_for_test", _UTILS)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def _read(path):
    with open(path) as f:
        return list(csv.reader(f))


def test_date_and_commit_are_appended(tmp_path, monkeypatch):
    monkeypatch.setenv("PRIMUS_TURBO_COMMIT", "abc1234")
    bu = _utils()
    path = bu.write_csv(tmp_path / "r.csv", [{"GPU": "h100", "Case": "a", "ms": 1.5}], ["GPU", "Case", "ms"])
    header, row = _read(path)
    assert header == ["GPU", "Case", "ms", "Date", "Commit"]
    assert row[:3] == ["h100", "a", "1.5"] and row[4] == "abc1234"
    assert len(row[3]) == 10 and row[3][4] == "-"  # an ISO date


def test_columns_of_the_benchmark_are_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("PRIMUS_TURBO_COMMIT", "abc1234")
    bu = _utils()
    rows = [{"gpu": "h100", "date": "2026-01-02", "commit": "deadbee", "op": "gemm"}]
    header, row = _read(bu.write_csv(tmp_path / "r.csv", rows, ["gpu", "date", "commit", "op"]))
    assert header == ["gpu", "date", "commit", "op"] and row == ["h100", "2026-01-02", "deadbee", "gemm"]
