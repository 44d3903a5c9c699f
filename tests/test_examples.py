"""The example scripts run and show what they claim."""

from __future__ import annotations

import importlib.util
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_exchange_tour(capsys):
    seen = _load("exchange_tour").main()
    assert seen["shared"] == 42.0
    assert seen["conj"] == [1 - 2j, 3 + 4j]
    assert seen["neg"] == [-2.0, 4.0]
    assert seen["reversed"] == [3.0, 2.0, 1.0, 0.0]
    assert seen["bf16"] == ("bfloat16", [1.5, -2.0])
    assert seen["readonly_warning"] == ["ReadOnlyWarning"]
    assert seen["copy_false"] == "CopyRequiredError"
    assert "reversed" in capsys.readouterr().out


def test_stream_large_tensor(tmp_path):
    seen = _load("stream_large_tensor").main(mib=4, directory=str(tmp_path), progress=False)
    n = 4 * (1 << 20) // 4
    assert seen["shape"] == (n // 1024, 1024)
    assert seen["round_trip_equal"] is True
    assert seen["last"] == float(n - 1)
    assert seen["file_bytes"] == n * 4 + 128
