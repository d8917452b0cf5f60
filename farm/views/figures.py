"""Figures for the report: matplotlib on Agg, each returned as a base64 PNG, drawn here or in worker processes.

A sweep report at farm scale draws a few dozen figures (two per alert, the heatmap, the drift view, the
distributions): a third of its time. ``figure_pool`` draws them in forked workers while this process goes on
computing, when forking is safe: no TVM loaded and no other thread (a fork copies only the calling thread; a
lock another thread held would stay held in the child, and TVM keeps a thread pool). ``farm report`` is such a
process; ``farm sweep``, which writes its report after measuring, draws them itself, one after another. The
figures are the same either way: the functions and arguments are.
"""

from __future__ import annotations

import base64
import contextlib
import io
import os
import sys
import threading
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from typing import Any, Callable, Iterator

FIGURE_WORKERS = 2
PARALLEL_FIGURES = 6  # fewer figures than this are drawn here: a fork would cost more than it saves


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def figure_png(fig, tight: bool = True) -> str:
    """The figure as base64 PNG. ``tight``: crop to what was drawn (a second full draw: ~40 % of a small figure's
    cost); figures drawn many times per report (an alert's evidence) set fixed margins instead."""
    plt = pyplot()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, **({"bbox_inches": "tight"} if tight else {}))
    plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


class InlineExecutor(Executor):
    """Runs each submitted figure at once, here: the same interface as the pool."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # the caller's .result() raises it, as a pool's would
            future.set_exception(exc)
        return future


def can_fork() -> bool:
    """Whether a fork here is safe and can help: fork exists, more than one CPU, no TVM, no other thread."""
    return (hasattr(os, "fork") and (os.cpu_count() or 1) > 1 and threading.active_count() == 1
            and not any(name == "tvm" or name.startswith(("tvm.", "tvm_ffi")) for name in sys.modules))


@contextlib.contextmanager
def figure_pool(figures: int) -> Iterator[Executor]:
    """An executor for ``figures`` figure functions (``submit(fn, *args).result()`` is the PNG): forked workers
    when there are enough figures and forking is safe, else this process."""
    if figures < PARALLEL_FIGURES or not can_fork():
        yield InlineExecutor()
        return
    import multiprocessing

    pyplot()  # imported once, here: the forked workers inherit it instead of importing it each
    with ProcessPoolExecutor(max_workers=FIGURE_WORKERS, mp_context=multiprocessing.get_context("fork")) as pool:
        yield pool
