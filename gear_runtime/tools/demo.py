"""``gear-runtime demo``: the whole flow on the built-in prefill example, checked end to end.

Sections: build the example model and write its config; parse the gear spec from the config;
compile a gear file and a hybrid gear file; run every gear and check its outputs against ONNX
Runtime running the original dynamic model (float: allclose 1e-5, int: exact); show an
out-of-gear request refused with its message (plain file) and served by the dynamic-shape
graph (hybrid file); then benchmark every gear. Ends with ``demo: all N checks passed`` and
returns 0 only when every check passed.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from gear_runtime.errors import GearMismatchError, GearRuntimeError

#: Tolerances of the float comparison with the original model (the brief's 1e-5).
RTOL = 1e-5
ATOL = 1e-5
#: A sequence length that is not a gear of the example (gears are 32/64/128/256).
OFF_GEAR_SEQ = 100


@dataclass
class _Checks:
    """Records and prints checks; the demo's exit code is whether they all passed."""

    out: TextIO
    results: list[tuple[str, bool, str]] = field(default_factory=list)

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.results.append((name, bool(ok), detail))
        mark = "ok  " if ok else "FAIL"
        self.out.write(f"  [{mark}] {name}" + (f": {detail}" if detail else "") + "\n")
        return bool(ok)

    @property
    def failed(self) -> list[tuple[str, bool, str]]:
        return [r for r in self.results if not r[1]]


def compare_outputs(got: Sequence[np.ndarray], want: Sequence[np.ndarray],
                    names: Sequence[str]) -> tuple[bool, str]:
    """Outputs equal to the reference: same shapes, floats allclose(RTOL, ATOL), ints exact."""
    if len(got) != len(want):
        return False, f"{len(got)} outputs, the original model gives {len(want)}"
    parts, ok = [], True
    for name, a, b in zip(names, got, want, strict=True):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape or a.dtype != b.dtype:
            ok = False
            parts.append(f"{name} {a.dtype}{a.shape} vs original {b.dtype}{b.shape}")
        elif np.issubdtype(a.dtype, np.floating):
            diff = float(np.max(np.abs(a - b))) if a.size else 0.0
            same = bool(np.allclose(a, b, rtol=RTOL, atol=ATOL))
            ok &= same
            parts.append(f"{name}{a.shape} max|diff| {diff:.1e}")
        else:
            same = bool(np.array_equal(a, b))
            ok &= same
            parts.append(f"{name}{a.shape} " + ("exact" if same else
                                                f"{int(np.sum(a != b))} values differ"))
    return ok, ", ".join(parts)


def run_demo(workdir: str | Path | None = None, iterations: int | None = None,
             quick: bool = False, out: TextIO | None = None, progress: bool = True,
             threads: int | None = 1) -> int:
    """Run the demo; returns the exit code (0: every check passed, 1: a check failed).

    ``workdir``: where the files go (kept); default a temporary directory, removed at the
    end (the output says so, and how to keep the files).
    ``iterations``: benchmark iterations per gear (default 100, or 20 with ``quick``).
    ``threads``: ORT intra-op threads of the benchmark's sessions (default 1: steadier numbers
    on a shared machine; None: ORT's default, one per core).
    """
    out = out or sys.stdout
    if iterations is None:
        iterations = 20 if quick else 100
    warmup = 3 if quick else 10
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix="gear-runtime-demo-") as tmp:
            code = _run(Path(tmp), iterations, warmup, out, progress, threads, kept=False)
        out.write(f"removed {tmp}; {KEEP_HINT}\n")
        return code
    return _run(Path(workdir), iterations, warmup, out, progress, threads, kept=True)


#: How to keep the demo's files: said whenever they go to a temporary folder.
KEEP_HINT = "to keep the files, run: gear-runtime demo --workdir DIR"


@contextmanager
def _section(out: TextIO, title: str) -> Iterator[None]:
    out.write(f"\n== {title} ==\n")
    start = time.perf_counter()
    yield
    out.write(f"  ({time.perf_counter() - start:.2f} s)\n")


def _run(workdir: Path, iterations: int, warmup: int, out: TextIO, progress: bool,
         threads: int | None, kept: bool) -> int:
    checks = _Checks(out)
    where = (f"files in {workdir} (kept)" if kept else
             f"files in the temporary folder {workdir}, removed at the end ({KEEP_HINT})")
    out.write(f"gear-runtime demo: the built-in prefill example, {where}\n")
    start = time.perf_counter()
    try:
        _steps(workdir, iterations, warmup, out, progress, threads, checks)
    except GearRuntimeError as exc:  # a step failed: that is a failed check, not a crash
        checks.check("demo step completed", False, str(exc))
    total = len(checks.results)
    out.write(f"\n({time.perf_counter() - start:.1f} s in all)\n")
    if checks.failed:
        out.write(f"demo: {len(checks.failed)} of {total} checks FAILED: "
                  + "; ".join(name for name, _, _ in checks.failed) + "\n")
        return 1
    out.write(f"demo: all {total} checks passed\n")
    return 0


def _steps(workdir: Path, iterations: int, warmup: int, out: TextIO, progress: bool,
           threads: int | None, checks: _Checks) -> None:
    import onnxruntime as ort

    from gear_runtime.compiler import compile_model
    from gear_runtime.examples import prefill
    from gear_runtime.runtime.model import load
    from gear_runtime.spec import GearSpec
    from gear_runtime.tools.bench.engine import bench_model
    from gear_runtime.tools.check.padding import check_padding

    with _section(out, "1. Build the example model"):
        model_path, config_path = prefill.write_example(workdir)
        out.write(f"  model:  {model_path} ({model_path.stat().st_size / 1024:.0f} KiB; inputs "
                  f"{', '.join(prefill.INPUT_NAMES)}; outputs {', '.join(prefill.OUTPUT_NAMES)})"
                  f"\n  config: {config_path}\n")
        for line in config_path.read_text(encoding="utf-8").splitlines():
            out.write(f"    | {line}\n")

    with _section(out, "2. Parse the gear spec from the config"):
        spec = GearSpec.from_config(str(config_path))
        out.write(f"  mode {spec.mode}; inputs (user_designate_shape_order): "
                  f"{', '.join(spec.input_names)}\n")
        for i in range(spec.gear_count):
            shapes = "  ".join(f"{n}{list(s)}" for n, s in spec.shapes(i).items())
            out.write(f"  gear {i}: {','.join(map(str, spec.gears[i]))}  ->  {shapes}\n")
        want = tuple((s, s, s, prefill.IMAGE_TOKENS) for s in prefill.SEQ_GEARS)
        checks.check("config parsed to the four sequence gears",
                     spec.mode == "dims" and spec.gears == want
                     and spec.input_names == prefill.INPUT_NAMES,
                     f"gears {list(spec.gears)}")

    with _section(out, "3. Compile: a gear file and a hybrid gear file"):
        gear_path, hybrid_path = workdir / "prefill.gear.onnx", workdir / "prefill.hybrid.onnx"
        compile_model(str(model_path), spec, str(gear_path), progress=progress)
        compile_model(str(model_path), spec, str(hybrid_path), hybrid=True, progress=progress)
        for p in (gear_path, hybrid_path):
            out.write(f"  wrote {p} ({p.stat().st_size / 1024:.0f} KiB)\n")
        from gear_runtime.tools.check.inspect import describe

        for line in describe(str(gear_path)).splitlines():
            out.write(f"    | {line}\n")

    opts = ort.SessionOptions()
    opts.log_severity_level = 4  # its errors come back as exceptions
    original = ort.InferenceSession(str(model_path), opts, providers=["CPUExecutionProvider"])

    def reference(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return original.run(None, feeds)

    with _section(out, "4. Run every gear; check against the original dynamic model on ORT"):
        model = load(str(gear_path))
        ex = model.create_executor()
        out.write(f"  loaded: {model!r}\n")
        for g in range(model.gear_count):
            feeds = prefill.example_inputs(model.spec, g, seed=g)
            ex.set_dynamic_dims(model.spec.full_dims(g))  # aclmdlSetInputDynamicDims style
            got = ex.execute(feeds)
            ok, detail = compare_outputs(got, reference(feeds), model.output_names)
            shapes_ok = all(tuple(o.shape) == tuple(model.output_shape(g, k))
                            for k, o in enumerate(got))
            checks.check(f"gear {g} {model.gears[g]} matches the original",
                         ok and shapes_ok and ex.last_gear == g,
                         f"ran gear {ex.last_gear}; {detail}")
        ex.clear_dynamic_dims()

    off_feeds = prefill.inputs_for_shapes(prefill.example_shapes(OFF_GEAR_SEQ), seed=7)
    off_dims = (OFF_GEAR_SEQ,) * 3 + (prefill.IMAGE_TOKENS,)
    with _section(out, f"5. Out-of-gear request (seq_len {OFF_GEAR_SEQ}) on the gear file"):
        _expect_refusal(out, checks, f"execute with seq_len {OFF_GEAR_SEQ} inputs is refused",
                        lambda: ex.execute(off_feeds))
        _expect_refusal(out, checks, f"set_dynamic_dims({list(off_dims)}) is refused",
                        lambda: ex.set_dynamic_dims(off_dims))

    with _section(out, "6. Hybrid gear file: a gear runs as that gear, a miss on the source graph"):
        hmodel = load(str(hybrid_path))
        hex_ = hmodel.create_executor()
        got = hex_.execute(off_feeds)
        ok, detail = compare_outputs(got, reference(off_feeds), hmodel.output_names)
        checks.check(f"seq_len {OFF_GEAR_SEQ} served by the dynamic-shape graph",
                     ok and hex_.last_gear is None,
                     f"last_gear {hex_.last_gear}; {detail}")
        g = hmodel.gear_count - 1
        feeds = prefill.example_inputs(hmodel.spec, g, seed=g)
        ok, detail = compare_outputs(hex_.execute(feeds), reference(feeds), hmodel.output_names)
        checks.check(f"gear {g} {hmodel.gears[g]} on the hybrid file runs as gear {g}",
                     ok and hex_.last_gear == g, f"last_gear {hex_.last_gear}; {detail}")

    with _section(out, f"7. Per-gear benchmark ({iterations} iterations, {warmup} warm-up)"):
        # a fresh load, so the sessions get ``threads`` (the reference gets the same)
        report = bench_model(str(gear_path), iterations=iterations, warmup=warmup,
                             threads=threads, reference=str(model_path), progress=progress,
                             inputs=lambda m, gear: prefill.example_inputs(m.spec, gear,
                                                                           seed=gear))
        out.write(report.table() + "\n")
        checks.check("every gear benchmarked",
                     [r.gear for r in report.gears] == list(range(model.gear_count)))

    with _section(out, "8. check-padding: any seq_len padded to its gear, vs the original"):
        padding = check_padding(str(gear_path), str(model_path),
                                   pad_values={"attention_mask": 0},
                                   inputs=lambda shapes: prefill.inputs_for_shapes(shapes))
        out.write("".join(f"  {line}\n" for line in padding.table().splitlines()))
        checks.check("padding is safe (attention_mask padded with 0)", padding.safe)

    _service(workdir, out, checks)


#: Tokens the demo generates per prompt in its service section.
NEW_TOKENS = 16


def _service(workdir: Path, out: TextIO, checks: _Checks) -> None:
    """Seed 004's service: a prefill at seq gears hands its KV cache to a static decode that
    keeps it resident; tokens checked against plain ORT on the same two files."""
    from gear_runtime.examples import causal_lm
    from gear_runtime.tools import generate

    sizes = causal_lm.SMALL
    with _section(out, "9. The service: prefill at seq gears -> static decode, cache resident"):
        prefill_src, gear_file, decode_file = generate.build_pair(workdir / "lm", sizes)
        gen = generate.Generator(gear_file, decode_file)
        out.write(f"  prefill {gear_file.name}: gears {gen.prefill.gears}; decode "
                  f"{decode_file.name}: {gen.decode.mode}, gears {gen.decode.gears}\n"
                  f"  decode executor: state {gen.dex.state_names} "
                  f"({sizes.cache_nbytes / 2**20:.1f} MiB, double-buffered); weights shared: "
                  f"{gen.prefill.shared_weights[0]} tensors, "
                  f"{gen.prefill.shared_weights[1] / 2**20:.1f} MiB held once\n")
        reference = generate.ort_sessions(prefill_src, decode_file)
        for length in (5, *sizes.seq_gears):
            ids = causal_lm.prompt(length, sizes, seed=length)
            gear = generate.covering_gear(length, sizes.seq_gears)
            start = time.perf_counter()
            tokens = gen.generate(ids, NEW_TOKENS)
            took = time.perf_counter() - start
            want = generate.reference_tokens(*reference, ids, gear, NEW_TOKENS)
            out.write(f"  prompt {length:>3} (gear {gear:>3}): {NEW_TOKENS} tokens in "
                      f"{took * 1000:6.1f} ms  {tokens[:8]}...\n")
            checks.check(f"prompt {length}: greedy tokens equal plain ORT's", tokens == want,
                         f"got {tokens}, ORT {want}")
        gen.close()


def _expect_refusal(out: TextIO, checks: _Checks, name: str, call: Callable[[], Any]) -> None:
    """The call must raise GearMismatchError with GE's code 145013; its message (which names
    the legal gears) is printed for the reader, not checked. Another GearRuntimeError
    propagates: a failed step."""
    try:
        call()
    except GearMismatchError as exc:
        out.write(f"  refused: {exc}\n")
        checks.check(name, exc.code == "145013", f"code {exc.code}")
        return
    checks.check(name, False, "it was NOT refused")


__all__ = ["ATOL", "KEEP_HINT", "RTOL", "compare_outputs", "run_demo"]
