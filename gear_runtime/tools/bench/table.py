"""The human table of a benchmark run (``gear-runtime bench`` prints it)."""

from __future__ import annotations

from typing import Any

from gear_runtime.backends import DEFAULT_BACKEND, facts
from gear_runtime.tools.common.textfmt import format_bytes
from gear_runtime.tools.common.textfmt import format_table as text_table


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_table(report: Any) -> str:
    """Fixed-width table of ``report`` (a :class:`~gear_runtime.tools.bench.report.BenchReport`,
    whose ``table()`` calls this; not imported here, so the two modules do not import each
    other): latency percentiles, throughput, overhead, comparison columns."""
    header = ["gear", "dims", "p50 ms", "p90 ms", "p99 ms", "throughput", "bare p50",
              "overhead us", "naive p50", "x naive", "dynamic p50", "x dynamic"]
    rows = [header]
    for r in report.gears:
        rows.append([
            str(r.gear), dims_text(r.dims),
            _fmt(r.execute.p50, ".3f"), _fmt(r.execute.p90, ".3f"), _fmt(r.execute.p99, ".3f"),
            f"{r.throughput:,.0f} {r.throughput_unit}",
            _fmt(r.bare.p50 if r.bare else None, ".3f"), _fmt(r.overhead_us, ".1f"),
            _fmt(r.naive.p50 if r.naive else None, ".3f"), _fmt(r.speedup_vs_naive, ".2f"),
            _fmt(r.dynamic.p50 if r.dynamic else None, ".3f"),
            _fmt(r.speedup_vs_dynamic, ".2f"),
        ])
    lines = text_table(rows, right=lambda c: c >= 2, rule=True)
    threads = report.threads if report.threads is not None else "ORT default"
    lines += [
        "",
        f"model: {report.model} ({report.backend}, {report.mode} mode), "
        f"{report.iterations} iterations after {report.warmup} warm-up, threads: {threads}",
        *column_notes(report.copy, report.reference, report.backend,
                      static=report.mode == "static", state=report.state),
        f"memory: process RSS after load {format_bytes(report.rss_after_load_bytes)}; executor "
        f"staging {format_bytes(report.staging_bytes)} + outputs "
        f"{format_bytes(report.output_buffer_bytes)}{_state_bytes(report.state)}",
    ]
    return "\n".join(lines)


def dims_text(dims: tuple[int, ...] | list[int]) -> str:
    """A gear's dynamic values as the table shows them: ``64,64``, or ``static`` for the one
    gear of a static model (which has no dynamic value)."""
    return ",".join(map(str, dims)) if len(dims) else "static"


def _state_bytes(state: list[dict[str, Any]]) -> str:
    """`` + resident state 256.0 KiB (2 buffers)`` of the memory line; empty without state."""
    if not state:
        return ""
    # a double-buffered pair holds two buffers (the one a run reads, the one it writes)
    total = sum(p["bytes"] * (1 if p["mode"] == "in place" else 2) for p in state)
    return f" + resident state {format_bytes(total)}"


def ais_bench_note(copy: bool = True) -> str:
    """What the NPU_compute_time of the ais_bench lines is here (printed once under them):
    ``execute`` with (``copy``) or without the output copy."""
    work = "input staging + run + output copy" if copy else "input staging + run, no output copy"
    return (f"NPU_compute_time above = execute(): {work} (ais_bench's is the device run "
            "alone); the throughput counts --batchsize items per run (default: the first "
            "input's first dim, its mean over the runs)")


def ais_bench_lines(summary: Any, what: str) -> list[str]:
    """ais_bench's Performance Summary lines of ``summary`` (an
    :class:`~gear_runtime.tools.bench.report.AisBenchSummary`) as ais_bench prints them,
    without its ``[INFO]`` prefix so that what parses ais_bench's output parses these, under a
    title naming ``what`` was timed (what the times are: :func:`ais_bench_note`)."""
    mean = f"{summary.mean:.4f}"
    return [
        f"Performance Summary (ais_bench) of {what}: {summary.count} {summary.runner}() runs, "
        f"batchsize {summary.batchsize:g}",
        f"NPU_compute_time (ms): min = {summary.min:.4f}, max = {summary.max:.4f}, mean = "
        f"{mean}, median = {summary.median:.4f}, percentile(99%) = {summary.p99:.4f}",
        f"throughput 1000*batchsize.mean({summary.batchsize:g})/NPU_compute_time.mean({mean}): "
        f"{summary.throughput:.2f}",
    ]


def format_ais_bench(report: Any) -> str:
    """ais_bench's Performance Summary of every gear of ``report`` (a BenchReport: ais_bench
    runs one gear per invocation, so one block per gear), then once what its times are."""
    lines: list[str] = []
    for r in report.gears:
        what = f"gear {r.gear} (dims {dims_text(r.dims)})" if len(r.dims) else \
            f"gear {r.gear} (a static model)"
        lines += ais_bench_lines(r.ais_bench, what)
    return "\n".join([*lines, ais_bench_note(report.copy)])


def column_notes(copy: bool, reference: str | None, backend: str = "onnxruntime", *,
                 static: bool = False, state: list[dict[str, Any]] | None = None) -> list[str]:
    """What each column of the table includes (on ``backend``): the lines printed under it.
    ``static``: a static model, which has no dynamic original to compare with unless one was
    given (``reference``); ``state``: the executor's resident state pairs (report.state)."""
    if copy:
        execute = ("execute(copy=True) = gear match + input staging + backend run + outputs "
                   "returned in arrays the caller keeps")
        overhead = "includes the output copy (without it: --no-copy)"
    else:
        execute = ("execute(copy=False) = gear match + input staging + backend run; outputs "
                   "are views of the executor's buffers")
        overhead = "no output copy"
    naive = facts(backend).naive or facts(DEFAULT_BACKEND).naive
    if state:
        pairs = ", ".join(f"{p['input']} <- {p['output']} ({p['mode']})" for p in state)
        execute += (f"; the state {pairs} stays resident, never copied in or out (zeros "
                    "first, then what each run wrote)")
        naive += ", the state inputs too: copied in and out every run"
    if reference is not None:
        dynamic = f"; dynamic = ONNX Runtime on the original dynamic model ({reference})"
    elif static:  # nothing dynamic to compare with: no --reference to suggest
        dynamic = "; no dynamic column: a static model has no dynamic original"
    else:
        dynamic = ("; dynamic = ONNX Runtime on the original dynamic model (not known: pass "
                   "--reference)")
    return [
        f"{execute}; p50/p90/p99 and throughput are of execute",
        "bare = the backend's run of the same gear on the executor's pre-bound buffers "
        "(no staging, no copy)",
        f"overhead us = median over iterations of (execute - bare): {overhead}",
        f"naive = {naive}{dynamic}; x = their p50 / execute p50",
    ]


__all__ = ["ais_bench_lines", "ais_bench_note", "column_notes", "dims_text",
           "format_ais_bench", "format_table"]
