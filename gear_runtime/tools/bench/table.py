"""The human table of a benchmark run (``gear-runtime bench`` prints it)."""

from __future__ import annotations

from typing import Any

from gear_runtime.tools.textfmt import format_bytes
from gear_runtime.tools.textfmt import format_table as text_table


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
            str(r.gear), ",".join(map(str, r.dims)),
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
        *column_notes(report.copy, report.reference, report.backend),
        f"memory: process RSS after load {format_bytes(report.rss_after_load_bytes)}; executor "
        f"staging {format_bytes(report.staging_bytes)} + outputs "
        f"{format_bytes(report.output_buffer_bytes)}",
    ]
    return "\n".join(lines)


def column_notes(copy: bool, reference: str | None,
                 backend: str = "onnxruntime") -> list[str]:
    """What each column of the table includes (on ``backend``): the lines printed under it."""
    if copy:
        execute = ("execute(copy=True) = gear match + input staging + backend run + outputs "
                   "returned in arrays the caller keeps")
        overhead = "includes the output copy (without it: --no-copy)"
    else:
        execute = ("execute(copy=False) = gear match + input staging + backend run; outputs "
                   "are views of the executor's buffers")
        overhead = "no output copy"
    return [
        f"{execute}; p50/p90/p99 and throughput are of execute",
        "bare = the backend's run of the same gear on the executor's pre-bound buffers "
        "(no staging, no copy)",
        f"overhead us = median over iterations of (execute - bare): {overhead}",
        f"naive = {NAIVE.get(backend, NAIVE['onnxruntime'])}; dynamic = ONNX Runtime on the "
        f"original dynamic model ({reference or 'not known: pass --reference'}); "
        "x = their p50 / execute p50",
    ]


#: What the naive column runs on each backend (BackendModel.naive_run).
NAIVE = {"onnxruntime": "session.run(None, feeds) on the model's session",
         "openvino": "OpenVINO's own dynamic-shape model of the source graph (x naive: what "
                     "the static gears gain)"}


__all__ = ["column_notes", "format_table"]
