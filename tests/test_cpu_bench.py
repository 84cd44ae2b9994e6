"""bench/cpu_bench.py end to end on tiny cases: it checks the op against SDPA
before timing, times the thread scaling, and its JSON and README table carry
every case."""

import json

import bench.cpu_bench as cpu_bench


def test_tiny_run_writes_every_case(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cpu_bench, "MATMUL_SIZE", 128)
    out = tmp_path / "cpu.json"
    result = cpu_bench.main(["--contexts", "64,300", "--drafts", "4", "--heads", "8/1/64,4/2/32",
                             "--dtypes", "fp32,bf16", "--threads", "2", "--repeats", "1",
                             "--markdown", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert len(result["rows"]) == 2 * 2 * 2
    assert all(r["rel_err_vs_sdpa_fp32"] < 1e-2 for r in result["rows"])
    assert {(r["dtype"], r["seq_len"]) for r in result["scaling"]} == {
        (d, n) for d in ("fp32", "bf16") for n in (64, 300)}
    assert result["meta"]["command"].startswith("python -m bench.cpu_bench --contexts 64,300")
    assert "Model name" in result["meta"]["cpu"]
    assert set(result["meta"]["matmul_sizes"].values()) <= {128, 32}
    table = capsys.readouterr().out
    assert "| fp32 | 8/1/64 | 4 |" in table and "| bf16 | 4/2/32 | 4 |" in table


def test_a_slow_matmul_is_timed_at_a_quarter_of_the_size(monkeypatch):
    monkeypatch.setattr(cpu_bench, "MATMUL_SIZE", 128)
    assert cpu_bench.matmul_size(cpu_bench.torch.float32) == 128
    monkeypatch.setattr(cpu_bench, "SLOW_MATMUL_S", 0.0)  # every call counts as slow
    assert cpu_bench.matmul_size(cpu_bench.torch.float32) == 32
