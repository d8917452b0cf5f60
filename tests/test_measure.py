"""The measurement package's promises that need no device: its docstring is its table of steps, its draft is the
BenchResult's fields, memory that cannot be read leaves the run unmeasured (not failed), and device types are
named through TVM's public API."""

import dataclasses
import json
import re

import farm.measure
from farm.measure import STEPS, Memory, RunDraft
from farm.measure.copies import CPU_DEVICE_TYPE, _kernel_only
from farm.records import BenchResult


def test_the_docstring_is_the_table_of_steps_numbered_once_in_the_code_s_order():
    rows = re.findall(r"^    (\d+) (\w+) ", farm.measure.__doc__ or "", re.MULTILINE)
    assert [int(number) for number, _ in rows] == list(range(1, len(STEPS) + 1))
    assert [name for _, name in rows] == [step.name for step in STEPS]
    assert re.search(r"^      cleanup ", farm.measure.__doc__ or "", re.MULTILINE)  # unnumbered: it always runs


def test_the_draft_holds_bench_result_fields_with_their_defaults():
    results = {f.name: f for f in dataclasses.fields(BenchResult)}
    for field in dataclasses.fields(RunDraft):
        assert field.name in results, f"RunDraft.{field.name} is not a BenchResult field"
        if field.name not in ("context", "check"):  # context is given; check None: not reached (built at its step)
            assert field.default == results[field.name].default, field.name
            assert field.type == results[field.name].type, field.name


def test_a_server_that_cannot_reset_or_read_memory_leaves_it_unmeasured_not_the_run_failed():
    """farm.MemoryStats says whether the peak was reset (here it is); a reader whose reset failed keeps no peak, and
    one that fails keeps no reading at all, with the reason: memory is a side figure, never a run's failure."""
    from farm.rpc.server import memory_stats

    here = json.loads(memory_stats(1))
    assert here["peak_reset"] is True and here["rss_bytes"] > 0 and json.loads(memory_stats(0))["peak_reset"] is False

    draft = RunDraft(context={})
    no_reset = Memory(lambda reset: json.dumps({**here, "peak_reset": False}), draft, emulated=False)
    draft.rss_before_load_bytes = no_reset.read(reset_peak=True)
    no_reset.read(peak=True)
    assert (draft.rss_before_load_bytes, draft.rss_after_load_bytes, draft.rss_peak_bytes) == (here["rss_bytes"], None, None)
    assert "peak not measured" in draft.context["memory"]

    def broken(reset: int) -> str:
        raise RuntimeError("RPCError: the server went away")

    draft = RunDraft(context={}, rss_before_load_bytes=1, rss_peak_bytes=2)
    failing = Memory(broken, draft, emulated=True)
    assert failing.read() is None
    assert (draft.rss_before_load_bytes, draft.rss_after_load_bytes, draft.rss_peak_bytes) == (None, None, None)
    assert draft.context["memory"].startswith("not measured: reading the server's memory failed")
    assert "memory_total_bytes" not in draft.context


def test_device_types_are_named_by_tvm_s_public_api():
    """Copies on OpenCL are timed by the CPU's clock: the DLPack codes (kDLCPU 1, kDLCUDA 2, kDLOpenCL 4) as TVM
    names them, so a TVM that renumbers or renames them fails here, not in a copy's figure."""
    assert CPU_DEVICE_TYPE == 1
    assert [code for code in range(1, 20) if _kernel_only(code)] == [4]
