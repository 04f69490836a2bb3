"""The HTML report as a person sees it (ctest verify_report_html; docs/report.md).

Writes the reports of `oasis-verify compare --html` for the worked example (attention, passing and
with the LSE mistake) and for a model trace (passing and with one MLP output moved), opens each in
headless Chromium and asserts that the page rendered without a script error (the page's script
sets data-oasis-status="ok" and writes errors into the page), that every tensor judged element by
element has its heat maps, that the failing tensors' maps show cells outside the bound and the
passing ones none, and that the screenshot is not blank. A page whose data is corrupted must show
the error (the check can fail). Exit 77 (skipped) when chromium is not installed.

  test_report_html.py --verify oasis-verify --producer worked_example_producer
                      --traces trace_producer --work DIR
"""

import argparse
import os
import re
import shutil
import struct
import subprocess
import sys
import zlib


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def run(cmd, want):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if p.returncode != want:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {p.returncode}, expected {want}\n{p.stdout}\n{p.stderr}")
    return p.stdout


def browser(exe, args, url):
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args, url]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {p.returncode}\n{p.stderr[-2000:]}")
    return p.stdout


def png_pixels(path):
    """(width, height, rows of RGB(A) bytes) of an 8-bit RGB or RGBA PNG (what Chromium writes)."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    pos, idat = 8, b""
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and ctype in (2, 6), f"{path}: bit depth {depth}, colour type {ctype}"
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    bpp = 3 if ctype == 2 else 4
    raw, stride, rows, prev = zlib.decompress(idat), w * bpp, [], bytearray(w * bpp)
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return w, h, bpp, rows


def check_not_blank(path):
    w, h, bpp, rows = png_pixels(path)
    lum = [sum(r[i:i + 3]) / 3 for r in rows[::4] for i in range(0, w * bpp, 4 * bpp)]
    mean = sum(lum) / len(lum)
    var = sum((x - mean) ** 2 for x in lum) / len(lum)
    colours = {r[i:i + 3] for r in rows[::4] for i in range(0, w * bpp, 4 * bpp)}
    print(f"  screenshot {os.path.basename(path)}: {w}x{h}, luminance variance {var:.0f}, {len(colours)} colours")
    assert var > 100 and len(colours) > 20, f"{path} looks blank (variance {var:.1f}, {len(colours)} colours)"


def check_page(exe, html, work, stem, failing, passing):
    """Loads `html`; `failing`/`passing`: tensor names whose heat maps must show / not show cells over the bound."""
    text = open(html, encoding="utf-8").read()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text), f"{html} loads something from the network"
    assert "<link" not in text and "<script src" not in text, f"{html} is not self-contained"
    dom = browser(exe, ["--dump-dom"], "file://" + os.path.abspath(html))
    status = re.search(r'data-oasis-status="(\w+)"', dom)
    errors = re.search(r'<div id="oasis-errors">(.*?)</div>', dom, re.S)
    assert status and status.group(1) == "ok", f"{html}: status {status and status.group(1)}; errors: {errors and errors.group(1)}"
    assert errors and errors.group(1).strip() == "", f"{html}: script errors {errors.group(1)}"
    sections = re.findall(r'<section class="tensor" id="t\d+">(.*?)</section>', dom, re.S)
    assert sections, f"{html}: no tensor sections"
    maps = 0
    for sec in sections:
        name = re.search(r'<span class="mono">(\S+) \[', sec).group(1)
        canvases = re.findall(r'<canvas class="oasis-heatmap"[^>]*data-cells="(\d+)" data-over="(\d+)"', sec)
        if "No element map" in sec:
            continue
        maps += 1
        assert canvases and all(int(c) > 0 for c, _ in canvases), f"{html}: {name} has no drawn heat map"
        over = max(int(o) for _, o in canvases)
        if name in failing:
            assert over > 0, f"{html}: the heat maps of failing {name} show no cell over the bound"
        if name in passing:
            assert over == 0, f"{html}: the heat maps of passing {name} show {over} cells over the bound"
        assert "oasis-histogram" in sec, f"{html}: {name} has no histogram"
    assert maps > 0, f"{html}: no tensor has heat maps"
    shot = os.path.join(work, stem + ".png")
    browser(exe, ["--screenshot=" + shot, "--window-size=1100,1400"], "file://" + os.path.abspath(html))
    check_not_blank(shot)
    print(f"  {stem}: rendered, {len(sections)} tensors, {maps} with heat maps")
    return dom


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--verify", required=True)
    ap.add_argument("--producer", required=True)
    ap.add_argument("--traces", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    exe = chromium()
    if not exe:
        print("SKIPPED: chromium is not installed (Debian: apt-get install chromium; scripts/install-deps.sh --test)")
        return 77
    shutil.rmtree(a.work, ignore_errors=True)
    dirs = {k: os.path.join(a.work, k) for k in ("good", "lse", "model", "model_mlp")}
    for d in dirs.values():
        os.makedirs(d)
    run([a.producer, dirs["good"]], 0)
    run([a.producer, dirs["lse"], "--mistake", "lse"], 0)
    run([a.traces, dirs["model"]], 0)
    run([a.traces, dirs["model_mlp"], "--mistake", "mlp"], 0)
    pages = {
        "attention_pass": (os.path.join(dirs["good"], "attention.json"), 0, [], ["out", "lse", "p_null"]),
        "attention_fail": (os.path.join(dirs["lse"], "attention.json"), 1, ["lse", "p_null"], ["out"]),
        "model_pass": (os.path.join(dirs["model"], "model.json"), 0, [], ["layers.0.mlp.output", "layers.1.attn.p_null"]),
        "model_fail": (os.path.join(dirs["model_mlp"], "model.json"), 1, ["layers.0.mlp.output"], ["layers.0.attn.output"]),
    }
    doms = {}
    for stem, (config, rc, failing, passing) in pages.items():
        html = os.path.join(a.work, stem + ".html")
        run([a.verify, "compare", config, "--html", html, "--no-progress"], rc)
        doms[stem] = check_page(exe, html, a.work, stem, failing, passing)
    # the model's steps, the first wrong one marked
    assert "first wrong step" in doms["model_fail"] and "oasis-diagram" in doms["model_fail"]
    assert "first wrong step" not in doms["model_pass"].split('class="oasis-diagram"')[1].split("</svg>")[0]
    # a page with corrupted data shows the error instead of failing silently
    text = open(os.path.join(a.work, "attention_pass.html"), encoding="utf-8").read()
    bad = os.path.join(a.work, "corrupt.html")
    open(bad, "w", encoding="utf-8").write(text.replace('<script type="application/json" id="oasis-data">{', '<script type="application/json" id="oasis-data">{,', 1))
    dom = browser(exe, ["--dump-dom"], "file://" + bad)
    assert 'data-oasis-status="error"' in dom and "script error" in dom, "a corrupted page did not report its error"
    # an unwritable --html path is a named input error
    p = subprocess.run([a.verify, "compare", pages["attention_pass"][0], "--html", "/nonexistent/dir/r.html", "--no-progress"],
                       capture_output=True, text=True)
    assert p.returncode == 2 and "/nonexistent/dir/r.html" in p.stderr, (p.returncode, p.stderr)
    print("PASS: 4 reports rendered in", exe)
    return 0


if __name__ == "__main__":
    sys.exit(main())
