"""oasis._progress: the ``progress`` argument of oasis.check and oasis.check_model.

The engine calls a progress function about every 0.25 s once a check has run 2 s, and once more at
its end (docs/report.md, "Progress"), with a dict: op, tensors_done, tensors_total, elements_done,
elements_total (0: not known), elements_mp50, level (the oracle at work: "double", "mp50", ...),
seconds, finished. ``progress=True`` redraws one line on sys.stderr; a callable receives the dicts
(on the engine's reporting thread); None or False: nothing.
"""

import sys

from ._arrays import fail


def _count(n):
    return f"{n / 1e6:.1f}M" if n >= 10_000_000 else f"{n / 1e3:.1f}k" if n >= 10_000 else str(n)


def print_progress(p, stream=None):
    """One status line for the progress dict ``p``, redrawn in place; the last one ends it."""
    stream = stream or sys.stderr
    line = f"{p['op']}: {p['tensors_done']} of {p['tensors_total']} tensors, {_count(p['elements_done'])}"
    if p["elements_total"]:
        line += f" of {_count(p['elements_total'])} elements ({100 * p['elements_done'] / p['elements_total']:.0f} %)"
    else:
        line += " elements"
    line += f"; oracle: {p['level']}, {p['seconds']:.0f} s"
    stream.write("\r\033[K" + line + ("\n" if p["finished"] else ""))
    stream.flush()


def progress_callback(progress):
    """The engine's progress function for the ``progress`` argument (None for none)."""
    if progress is None or progress is False:
        return None
    if progress is True:
        return print_progress
    if not callable(progress):
        fail("progress", f"expected True, False, None or a callable taking a dict, got {type(progress).__name__}")
    return progress
