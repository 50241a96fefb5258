"""The GEMM probe (scripts/gemm_probe.py): its figures hang together, and bad input is refused."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from specdec.runtime.packed import unavailable_reason

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from gemm_probe import Stack, main, probe, runner, table


def test_the_probe_reports_ms_bound_and_arithmetic_rate_per_row_count():
    result = probe(k=32, n=64, layers=3, rows=[1, 4], modes=["eager"], repeats=3)
    figures = result["modes"]["eager"]
    assert set(figures) == {1, 4} and min(result["bound_ms"], result["bandwidth_gb_s"], result["square_gmac_per_s"]) > 0
    for m, f in figures.items():
        assert f["ms"] > 0 and f["vs_bound"] == pytest.approx(f["ms"] / result["bound_ms"])
        assert f["gmac_per_s"] == pytest.approx(m * 32 * 64 * 3 / f["ms"] / 1e6)
    assert "| eager | 4 |" in table(result)


def test_the_command_writes_its_figures_with_the_machine(tmp_path, capsys):
    out = tmp_path / "gemm.json"
    main(["--rows", "1,2", "--shape", "16x32", "--layers", "2", "--modes", "eager", "--repeats", "2", "--out", str(out)])
    written = json.loads(out.read_text())
    assert set(written["modes"]["eager"]) == {"1", "2"} and written["machine"]["cpu"]
    assert "2 linears of 16 -> 32" in capsys.readouterr().out


@pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))
def test_the_packed_mode_times_specdecs_kernel():
    from specdec.runtime.packed import PackedLinear

    stack = Stack(16, 50, 2)
    packed = runner(stack, "packed")
    assert all(isinstance(m, PackedLinear) for m in packed.linears) and type(stack.linears[0]) is torch.nn.Linear
    x = torch.randn(3, 16)
    for got, want in zip(packed(x), stack(x)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert set(probe(k=16, n=50, layers=2, rows=[1, 3], modes=["packed"], repeats=2)["modes"]["packed"]) == {1, 3}


@pytest.mark.parametrize("kwargs,message", [
    ({"rows": [0]}, "must be >= 1"),
    ({"modes": ["fast"]}, "mode must be one of"),
])
def test_bad_input_is_refused(kwargs, message):
    args = {"k": 8, "n": 8, "layers": 1, "rows": [1], "modes": ["eager"], "repeats": 1, **kwargs}
    with pytest.raises(ValueError, match=message):
        probe(**args)
