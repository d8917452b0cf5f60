"""A compile in a process of its own (``compile_apart``): a crash of TVM's compiler, or of the toolchain it runs (a
segfault, the host out of memory, a linker killed), fails that one compile with a ``BuildError``, and the process
that asked for it lives on. A lab worker compiles this way (#61: a compile that crashed took the worker down with
all its slots, and its job came back every ``lab.jobs.STALLED_S``).

One child per asking process, started with ``spawn`` (never ``fork``: the asker runs threads, TVM's among them)
when first needed and kept for the compiles after it: it imports TVM's compiler once (~2 s), not per compile. A
child that died is replaced at the next compile. Compiles go to it one at a time, as TVM's compiler runs anyway.
"""

from __future__ import annotations

import multiprocessing
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from farm.errors import BuildError, FarmError
from farm.records import Artifact, Device, ModelSource, TuningSet

_LOCK = threading.Lock()  # one compile at a time, and one child
# a compile whose child died is tried once more in a fresh one (a long-lived child that grew, or a neighbour's OOM
# kill, is not the model's fault); a second death is the compile's failure
CHILD_TRIES = 2
_CHILD: list[ProcessPoolExecutor] = []


def compile_apart(model: ModelSource, device: Device, cache_dir: Path, tuning: TuningSet | None) -> Artifact:
    """``build.compile_model`` in the child process; its ``FarmError`` as a ``BuildError`` with the same words, and
    the child's death as one saying so."""
    with _LOCK:
        for tries in range(1, CHILD_TRIES + 1):
            if not _CHILD:
                _CHILD.append(ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")))
            try:
                built, error = _CHILD[0].submit(_compile, model, device, str(cache_dir), tuning).result()
                break
            except BrokenProcessPool as exc:
                _CHILD.pop().shutdown(wait=False)
                if tries == CHILD_TRIES:
                    raise BuildError(f"the compile of {model.name} for {device.name} ended its process {tries} times "
                                     "(a crash, or the host out of memory): farm's worker lives on",
                                     "see the host's log (dmesg for an OOM kill)") from exc
    if error is not None:
        raise BuildError(*error)
    assert built is not None
    return built


def _compile(model: ModelSource, device: Device, cache_dir: str,
             tuning: TuningSet | None) -> tuple[Artifact | None, tuple[str, str] | None]:
    """In the child: the artifact, or the compile's error as (message, hint) (an exception class of farm's may not
    cross the process boundary whole)."""
    from farm.compile.build import compile_model
    from farm.tvm_private import import_tvm_without_torch

    import_tvm_without_torch()
    try:
        return compile_model(model, device, Path(cache_dir), tuning), None
    except FarmError as exc:
        return None, (exc.message, exc.hint)
