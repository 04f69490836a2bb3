"""oasis._figures: the paper's diagnostics of a model trace as PNG figures (docs/report.md).

The numbers come from the library (oasis/verify/figures.hpp): ``figures()`` has it write one CSV
per figure and a manifest ``figures.json`` into a directory, and ``draw_figures()`` turns each CSV
into a PNG beside it with matplotlib (Debian: python3-matplotlib). The same file is the plotting
script of ``oasis-verify figures`` (installed as share/oasis/oasis_figures.py):
``python3 oasis_figures.py DIR`` draws the CSVs of DIR and exits 3 when matplotlib cannot be
imported. It imports nothing but the standard library at the top, so it runs outside the package.
"""

import csv
import json
import os
import sys
import textwrap

NO_MATPLOTLIB = 3  # exit status of the script without matplotlib (verify/figures_cmd.cpp)


def figures(trace, model, out, draw=True):
    """Write the diagnostics of a model trace into directory ``out`` (created when missing).

    ``trace``: dict name -> tensor or a TraceRecorder, named as check_model reads them (``ids``
    is ignored); ``model``: a weights file path, an ``oasis.Model`` or ``(config, weights)``.
    Every figure is ``out/<name>.png`` with its numbers in ``out/<name>.csv``; a figure whose
    tensors the trace lacks is left out. Returns ``{"figures": [png paths], "left_out":
    ["<figure>: the trace lacks <tensor> ..."]}`` (with ``draw=False`` the CSV paths, no PNG)."""
    from . import Model, _arrays, _core
    from .trace import TraceRecorder

    if isinstance(trace, TraceRecorder):
        trace = trace.trace
    if not isinstance(trace, dict):
        _arrays.fail("trace", f"expected a dict {{name: tensor}} or a TraceRecorder, got {type(trace).__name__}")
    tr = _arrays.tensor_map({k: v for k, v in trace.items() if k != "ids"}, "trace")
    if not isinstance(out, (str, os.PathLike)):
        _arrays.fail("out", f"expected a directory path, got {type(out).__name__}")
    out = os.fspath(out)
    if isinstance(model, (str, os.PathLike)):
        names, left_out = _core.model_figures_file(os.fspath(model), tr, out)
    else:
        if isinstance(model, tuple) and len(model) == 2:
            model = Model(*model)
        if not isinstance(model, Model):
            _arrays.fail("model", f"expected a weights file path, an oasis.Model or (config, weights), got {type(model).__name__}")
        names, left_out = _core.model_figures_held(model._held, tr, out)
    if not draw:
        return {"figures": [os.path.join(out, n + ".csv") for n in names], "left_out": list(left_out)}
    return {"figures": draw_figures(out), "left_out": list(left_out)}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _read(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    return rows[0], rows[1:]


def _ordered(labels):
    """Distinct labels in order of appearance, integers sorted first, the others after."""
    seen = list(dict.fromkeys(labels))
    ints = sorted((s for s in seen if s.lstrip("-").isdigit()), key=int)
    return ints + [s for s in seen if not s.lstrip("-").isdigit()]


def _ticks(ax, axis, labels):
    step = max(1, len(labels) // 16)
    pos = list(range(0, len(labels), step))
    (ax.set_xticks if axis == "x" else ax.set_yticks)(pos)
    (ax.set_xticklabels if axis == "x" else ax.set_yticklabels)([labels[i] for i in pos], fontsize=8)


def _heatmap(fig, header, rows):
    import numpy as np

    ys = list(dict.fromkeys(r[0] for r in rows))
    xs = _ordered([r[1] for r in rows])
    grid = np.full((len(ys), len(xs)), np.nan)
    for r in rows:
        grid[ys.index(r[0]), xs.index(r[1])] = float(r[2])
    ax = fig.add_subplot(1, 1, 1)
    im = ax.imshow(np.ma.masked_invalid(grid), aspect="auto", cmap="viridis", interpolation="nearest")
    ax.set_xlabel(header[1])
    ax.set_ylabel(header[0])
    _ticks(ax, "x", xs)
    _ticks(ax, "y", ys)
    fig.colorbar(im, ax=ax, label=header[2])
    if grid.size <= 100:  # few cells: their values too
        mid = np.nanmean(grid)
        for (i, j), v in np.ndenumerate(grid):
            if np.isfinite(v):
                ax.text(j, i, f"{v:.3g}", ha="center", va="center", fontsize=7, color="white" if v < mid else "black")


def _lines(fig, header, rows):
    xs = [r[0] for r in rows]
    panels = header[1:]
    for k, name in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), k + 1)
        ax.plot(range(len(xs)), [float(r[k + 1]) for r in rows], marker="o", color=f"C{k}")
        ax.set_xlabel(header[0])
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
        _ticks(ax, "x", xs)
        if len(xs) > 6:
            for t in ax.get_xticklabels():
                t.set_rotation(45)
                t.set_ha("right")


def draw_figures(directory):
    """Draw every figure of ``directory/figures.json`` from its CSV into ``<name>.png`` beside it;
    returns the PNG paths. Raises ImportError when matplotlib is missing."""
    plt = _pyplot()
    with open(os.path.join(directory, "figures.json")) as f:
        manifest = json.load(f)
    written = []
    for fig_spec in manifest["figures"]:
        name = fig_spec["name"]
        header, rows = _read(os.path.join(directory, name + ".csv"))
        caption = textwrap.fill(fig_spec["caption"], 125)
        lines = caption.count("\n") + 1
        fig = plt.figure(figsize=(7.5, 4.0 + 0.14 * lines), dpi=100)
        if fig_spec["kind"] == "heatmap":
            _heatmap(fig, header, rows)
        else:
            _lines(fig, header, rows)
        fig.suptitle(fig_spec["title"], fontsize=11)
        fig.text(0.01, 0.01, caption, fontsize=7, va="bottom", ha="left", color="#444444")
        fig.tight_layout(rect=(0, (0.14 * lines + 0.15) / (4.0 + 0.14 * lines), 1, 0.95))
        path = os.path.join(directory, name + ".png")
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written


def main(argv):
    if len(argv) != 1:
        print("usage: oasis_figures.py DIR  (DIR written by oasis-verify figures or oasis.figures)", file=sys.stderr)
        return 2
    try:
        _pyplot()
    except ImportError as e:
        print(f"oasis_figures.py: matplotlib cannot be imported ({e})", file=sys.stderr)
        return NO_MATPLOTLIB
    draw_figures(argv[0])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
