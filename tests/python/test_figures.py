"""oasis.figures, Report.to_html / plot and the progress argument (docs/report.md)."""

import csv
import os
import time

import numpy as np
import pytest

import oasis

CONFIG = {"vocab_size": 16, "d_model": 8, "n_blocks": 3, "n_heads": 2, "d_ff": 12, "variant": "oasis",
          "router": "kimi_full", "readout": "final_attnres", "rope": "rotate_half", "init_std": 0.5}
FIGURES = ["null_mass", "depth_weights", "psi", "outliers", "sink_rate"]


@pytest.fixture(scope="module")
def case():
    model = oasis.Model.initialized(CONFIG, 5)
    ids = np.array([[1, 9, 2, 11, 4, 13, 6, 15, 8], [1, 3, 5, 7, 9, 11, 13, 15, 2]])
    trace = model.forward(ids, "float64", trace=True)
    trace["ids"] = ids
    return model, trace


def rows(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


def test_figures_writes_each_png_with_its_csv(case, tmp_path):
    pytest.importorskip("matplotlib", reason="python3-matplotlib is not installed (scripts/install-deps.sh --test)")
    model, trace = case
    res = oasis.figures(trace, model, tmp_path / "fig")
    assert res["left_out"] == []
    assert [os.path.basename(p) for p in res["figures"]] == [n + ".png" for n in FIGURES]
    for name in FIGURES:
        png = tmp_path / "fig" / (name + ".png")
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert 5000 < png.stat().st_size < 200_000
        assert (tmp_path / "fig" / (name + ".csv")).exists()


def test_figure_numbers_are_the_trace_statistics(case, tmp_path):
    model, trace = case
    oasis.figures(trace, model, tmp_path, draw=False)
    psi = rows(tmp_path / "psi.csv")
    assert psi[0] == ["layer", "psi"]
    for b in range(CONFIG["n_blocks"]):
        assert float(psi[b + 1][1]) == pytest.approx(trace[f"layers.{b}.attn.branch_psi"].mean(), rel=1e-13)
    for layer, head, value in rows(tmp_path / "null_mass.csv")[1:]:
        p = trace[f"layers.{layer}.attn.p_null"][:, int(head), :]
        assert float(value) == pytest.approx(p.mean(), rel=1e-13)
    for sub, kurt, max_abs in rows(tmp_path / "outliers.csv")[1:]:
        x = trace[sub + ".input"]
        assert float(max_abs) == pytest.approx(np.abs(x).max(axis=(1, 2)).mean(), rel=1e-15)
        d = x.reshape(x.shape[0], -1)
        d = d - d.mean(axis=1, keepdims=True)
        k = (d ** 4).mean(axis=1) / (((d ** 2).sum(axis=1) / (d.shape[1] - 1)) ** 2 + 1e-6)  # regularised
        assert float(kurt) == pytest.approx(k.mean(), rel=1e-4)


def test_a_figure_without_its_tensor_is_left_out(case, tmp_path):
    model, trace = case
    trace = {k: v for k, v in trace.items() if k != "layers.1.attn.p_null"}
    res = oasis.figures(trace, model, tmp_path, draw=False)
    assert len(res["left_out"]) == 1 and "the trace lacks layers.1.attn.p_null" in res["left_out"][0]
    assert not (tmp_path / "null_mass.csv").exists() and (tmp_path / "psi.csv").exists()


def test_an_unwritable_folder_is_a_named_error(case, tmp_path):
    model, trace = case
    (tmp_path / "file").write_text("x")
    with pytest.raises(oasis.InvalidArgument) as e:
        oasis.figures(trace, model, tmp_path / "file" / "sub", draw=False)
    assert e.value.argument == "out" and "file/sub" in str(e.value)
    with pytest.raises(oasis.InvalidArgument) as e:
        oasis.figures(trace, 42, tmp_path)
    assert e.value.argument == "model"


def test_report_html_and_plot(case, tmp_path):
    model, trace = case
    bad = dict(trace)
    bad["layers.0.mlp.output"] = trace["layers.0.mlp.output"] * (1 + 1e-3)
    report = oasis.check_model(model, bad)
    assert not report.passed
    html = report.to_html(tmp_path / "r.html")
    assert html.startswith("<!DOCTYPE html>") and (tmp_path / "r.html").read_text(encoding="utf-8") == html
    assert '"op":"model"' in html and "layers.0.mlp.output" in html and "http" not in html.split("<script>")[0]
    path = report.plot(tmp_path / "p.html", open_browser=False)
    assert os.path.exists(path)


def test_progress_argument(case):
    with pytest.raises(oasis.InvalidArgument) as e:
        oasis.check_model(case[0], case[1], progress="yes")
    assert e.value.argument == "progress"
    oasis.check_model(case[0], case[1], progress=False).assert_ok()  # quick: never called


def test_progress_callback_reports_and_its_exception_is_raised():
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 2, 288, 32)) for _ in range(3))  # about 3 to 8 s in mp50
    out = oasis.token_attention(q, k, v, causal=True)
    calls = []
    t0 = time.monotonic()
    report = oasis.check("attention", {"q": q, "k": k, "v": v}, {"out": out["out"], "lse": out["lse"]},
                         options={"causal": True}, oracle="mp50", progress=calls.append)
    report.assert_ok()
    if time.monotonic() - t0 < 2.5:
        pytest.skip("the check ran under 2.5 s on this machine: no progress is due")
    assert calls and calls[-1]["finished"] and calls[-1]["level"] == "mp50"
    assert calls[-1]["elements_done"] == calls[-1]["elements_total"] == out["out"].size + out["lse"].size
    assert all(c["op"] == "attention" and c["seconds"] >= 2 for c in calls)

    def boom(p):
        raise KeyError("from the callback")

    with pytest.raises(KeyError, match="from the callback"):
        oasis.check("attention", {"q": q, "k": k, "v": v}, {"out": out["out"]}, options={"causal": True},
                    oracle="mp50", progress=boom)
