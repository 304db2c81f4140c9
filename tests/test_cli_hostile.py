"""Hostile inputs for every ``gear-runtime`` command: one table, one rule.

Every row runs the installed command line in a fresh process (``python -m gear_runtime.cli``)
under a memory limit and a time limit, and asserts the CLI's error rule
(:mod:`gear_runtime.cli.common`): exit code 2, exactly ONE line on stderr starting with
``gear-runtime: error:``, no ``Traceback``, no "internal error" (the last-resort line of an
exception nobody checked for), and the fragment of the row in that line.

To add rows for a command, append :class:`Row` entries to ``ROWS`` (one section per command).
``argv`` items may name the fixture paths of :func:`paths` as ``{name}`` (see its docstring).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from models import CONV_BATCH_SPEC, conv_model

import gear_runtime as gr
from gear_runtime.examples import prefill

#: The address space a row may use (a row that reads /dev/zero into memory hits it fast).
MEMORY_LIMIT = 3 * 2**30
#: Seconds a row may take: start-up (numpy, onnx, ORT) plus a refusal. Generous for a
#: shared 2-core machine; a row that hangs (a FIFO) or grows without end exceeds it.
TIME_LIMIT = 30.0


@dataclass(frozen=True)
class Row:
    """One hostile command line and a fragment its one error line must contain. ``todo``:
    a known escape not fixed yet (the row is a strict xfail naming who fixes it; the fix
    removes the mark)."""

    id: str
    argv: tuple[str, ...]
    fragment: str
    todo: str = ""


def row(id: str, fragment: str, *argv: str, todo: str = "") -> Row:
    return Row(id, argv, fragment, todo)



# The big sample array and the deep nesting are built in the fixture (files too large to
# spell here); ``{name}`` items are replaced by the fixture's paths.
ROWS: list[Row] = [
    # ---- the parser (every command): argparse's own errors are one line too
    row("no-command", "COMMAND"),
    row("unknown-command", "invalid choice", "frobnicate"),
    row("unknown-flag", "unrecognized arguments", "inspect", "{gear}", "--frob"),
    # ---- compile
    row("compile-missing-model", "does not exist", "compile", "{tmp}/nope.onnx",
        "--input-shape", "x:-1,4", "--dynamic-batch-size", "1,2", "-o", "{tmp}/o.gear.onnx"),
    row("compile-model-directory", "is not a file", "compile", "{tmp}", "--input-shape",
        "x:-1,4", "--dynamic-batch-size", "1,2", "-o", "{tmp}/o.gear.onnx"),
    row("compile-model-dev-zero", "is not a file", "compile", "/dev/zero", "--input-shape",
        "x:-1,4", "--dynamic-batch-size", "1,2", "-o", "{tmp}/o.gear.onnx"),
    row("compile-model-fifo", "is not a file", "compile", "{fifo}", "--input-shape",
        "x:-1,4", "--dynamic-batch-size", "1,2", "-o", "{tmp}/o.gear.onnx"),
    row("compile-model-garbage", "not a readable ONNX model", "compile", "{garbage}",
        "--input-shape", "x:-1,4", "--dynamic-batch-size", "1,2", "-o", "{tmp}/o.gear.onnx"),
    row("compile-no-gear-flag", "--dynamic-batch-size", "compile", "{conv}",
        "--input-shape", "data:-1,3,32,32", "-o", "{tmp}/o.gear.onnx"),
    row("compile-two-gear-flags", "not allowed with", "compile", "{conv}", "--input-shape",
        "data:-1,3,32,32", "--dynamic-batch-size", "1,2", "--dynamic-dims", "1;2",
        "-o", "{tmp}/o.gear.onnx"),
    row("compile-bad-shape", "E10", "compile", "{conv}", "--input-shape", "data:a,b",
        "--dynamic-batch-size", "1,2", "-o", "{tmp}/o.gear.onnx"),
    row("compile-batch-negative", "E10003", "compile", "{conv}", "--input-shape",
        "data:-1,3,32,32", "--dynamic-batch-size=-1,2", "-o", "{tmp}/o.gear.onnx"),
    row("compile-batch-huge", "E10", "compile", "{conv}", "--input-shape",
        "data:-1,3,32,32", "--dynamic-batch-size", "1," + "9" * 30, "-o", "{tmp}/o.gear.onnx"),
    row("compile-unknown-input", "E10", "compile", "{conv}", "--input-shape",
        "nosuch:-1,3,32,32", "--dynamic-batch-size", "1,2", "-o", "{tmp}/o.gear.onnx"),
    row("compile-output-is-directory", "directory", "compile", "{conv}", "--input-shape",
        "data:-1,3,32,32", "--dynamic-batch-size", "1,2", "-o", "{tmp}"),
    row("compile-config-dev-zero", "is not a file", "compile", "{conv}", "--config", "/dev/zero",
        "-o", "{tmp}/o.gear.onnx"),
    row("compile-config-fifo", "is not a file", "compile", "{conv}", "--config", "{fifo}",
        "-o", "{tmp}/o.gear.onnx"),
    row("compile-config-garbage", "config", "compile", "{conv}", "--config", "{garbage}",
        "-o", "{tmp}/o.gear.onnx"),
    row("compile-a-gear-file", "already a gear file", "compile", "{gear}", "--input-shape",
        "input_ids:1,-1", "--dynamic-dims", "32;64", "-o", "{tmp}/o.gear.onnx"),
    row("compile-framework-caffe", "export the model to ONNX", "compile", "--model={conv}",
        "--framework=0", "--input_shape=data:-1,3,32,32", "--dynamic_batch_size=1,2",
        "--output={tmp}/o"),
    row("compile-model-twice", "give the model once", "compile", "{conv}", "--model", "{conv}",
        "--input-shape", "data:-1,3,32,32", "--dynamic-batch-size", "1,2", "-o", "{tmp}/o"),
    row("compile-no-model", "give the model to compile", "compile", "--input-shape",
        "data:-1,3,32,32", "--dynamic-batch-size", "1,2", "-o", "{tmp}/o"),
    # ---- inspect
    row("inspect-missing", "does not exist", "inspect", "{tmp}/nope.gear.onnx"),
    row("inspect-directory", "is not a file", "inspect", "{tmp}"),
    row("inspect-dev-zero", "is not a file", "inspect", "/dev/zero"),
    row("inspect-fifo", "is not a file", "inspect", "{fifo}"),
    row("inspect-garbage", "not an ONNX model", "inspect", "{garbage}"),
    row("inspect-empty", "empty", "inspect", "{empty}"),
    row("inspect-plain-onnx", "not a gear file", "inspect", "{conv}"),
    row("inspect-json-directory", "is a directory", "inspect", "{gear}", "--json", "{tmp}"),
    row("inspect-truncated", "not an ONNX model", "inspect", "{truncated}"),
    # ---- run
    row("run-input-syntax", "NAME=FILE.npy", "run", "{gear}", "--input", "nonsense"),
    row("run-input-dev-zero", "is not a file", "run", "{gear}", "--input", "input_ids=/dev/zero"),
    row("run-input-fifo", "is not a file", "run", "{gear}", "--input", "input_ids={fifo}"),
    row("run-input-garbage", "not a .npy file", "run", "{gear}", "--input",
        "input_ids={garbage_npy}"),
    row("run-input-bin-size", "fit 0 of the gears' shapes", "run", "{gear}", "--shapes",
        "attention_mask:1x32,position_ids:4x1x32,image_embeds:16x64", "--input",
        "input_ids={garbage}"),
    row("run-input-unknown-name", "has no input", "run", "{gear}", "--input", "nosuch={ids}"),
    row("run-dims-not-integers", "integers", "run", "{gear}", "--dynamic-dims", "1,a"),
    row("run-dims-huge", "beyond any tensor dimension", "run", "{gear}", "{inputs}",
        "--dynamic-dims", f"{2**63},64,64,16"),
    row("run-dims-short-form", "dynamic value(s) (gear 0: 32,32,32,16) or the full dims", "run",
        "{gear}", "{inputs}", "--dynamic-dims", "64"),
    row("run-no-inputs", "--shapes NAME:DIMS (synthetic)", "run", "{gear}"),
    row("run-shapes-syntax", "must be NAME:DIMS", "run", "{gear}", "--shapes", "1x64"),
    row("run-shapes-not-integers", "positive integers separated by 'x'", "run", "{gear}",
        "--shapes", "input_ids:1xa"),
    row("run-shapes-zero", "every dim must be >= 1", "run", "{gear}", "--shapes",
        "input_ids:0x64"),
    row("run-shapes-unknown-input", "the model has no input 'nosuch'", "run", "{gear}",
        "--shapes", "nosuch:1x64", "--dynamic-dims", "64,64,64,16"),
    row("run-shapes-rank", "1 dims [64]; the input has 2", "run", "{gear}", "--shapes",
        "input_ids:64", "--dynamic-dims", "64,64,64,16"),
    row("run-shapes-huge", "larger than every gear", "run", "{gear}", "--shapes",
        "input_ids:1x99999999999", "--dynamic-dims", "64,64,64,16"),
    row("run-shapes-and-input", "given by --input and by --shapes", "run", "{gear}",
        "--input", "input_ids={ids}", "--shapes", "input_ids:1x64"),
    row("run-shapes-no-gear", "145013", "run", "{gear}", "--shapes",
        "input_ids:1x100,attention_mask:1x100,position_ids:4x1x100,image_embeds:16x64"),
    row("run-pad-value-without-pad", "--pad-value needs --pad", "run", "{gear}",
        "--pad-value", "input_ids=0"),
    row("run-providers-other-backend", "--providers is an onnxruntime option", "run",
        "{gear}", "--backend", "null", "--providers", "cpu"),
    row("run-loop-zero", "must be >= 1", "run", "{gear}", "--loop", "0"),
    row("run-json-missing-dir", "does not exist", "run", "{gear}", "--json",
        "{tmp}/no/such/r.json"),
    row("run-batch-on-dims-model", "batch", "run", "{gear}", "{inputs}",
        "--dynamic-batch-size", "4"),
    row("run-output-dir-is-file", "--output-dir", "run", "{gear}", "{inputs}",
        "--output-dir", "{garbage}"),
    row("run-unknown-backend", "backend 'nosuch' is unknown", "run", "{gear}", "--backend",
        "nosuch"),
    row("run-batchsize-zero", "--batchsize: '0' must be >= 1", "run", "{gear}", "--batchsize",
        "0"),
    # run with ais_bench's --input folders (one inference per file)
    row("run-input-folders-uneven", "different numbers of .npy/.bin files", "run", "{gear}",
        "--input", "{folders:uneven}"),
    row("run-input-folder-fifo", "'x.npy' is not a regular file", "run", "{gear}", "--input",
        "{folders:fifo}"),
    row("run-input-folder-garbage", "not a .npy file", "run", "{gear}", "--input",
        "{folders:garbage}"),
    row("run-input-folders-and-files", "mixes folders", "run", "{gear}", "--input",
        "{folders:mixed}"),
    row("run-input-folders-too-few", "gives 2 folder(s)", "run", "{gear}", "--input",
        "{folders:two}"),
    # ---- bench
    row("bench-gears-out-of-range", "out of range", "bench", "{gear}", "--gears", "99"),
    row("bench-gears-float", "not a gear index", "bench", "{gear}", "--gears", "1.5"),
    row("bench-iterations-zero", "must be in 1..100000", "bench", "{gear}", "--iterations", "0"),
    row("bench-batchsize-not-integer", "--batchsize: 'x' is not an integer", "bench", "{gear}",
        "--batchsize", "x"),
    row("bench-iterations-huge", "must be in 1..100000", "bench", "{gear}", "--iterations",
        "1000000"),
    row("bench-shapes-and-gears", "drop --gears", "bench", "{gear}", "--shapes",
        "input_ids:1x64", "--gears", "1"),
    row("bench-shapes-huge", "larger than every gear", "bench", "{gear}", "--shapes",
        "input_ids:1x99999999999,attention_mask:1x64,position_ids:4x1x64,image_embeds:16x64"),
    row("bench-json-missing-dir", "does not exist", "bench", "{gear}", "--json",
        "{tmp}/no/such/dir/r.json"),
    row("bench-reference-missing", "does not exist", "bench", "{gear}", "--reference",
        "{tmp}/nope.onnx"),
    row("bench-reference-garbage", "could not be loaded by onnxruntime", "bench", "{gear}",
        "--reference", "{garbage}", "--iterations", "1", "--warmup", "0"),
    row("bench-reference-other-inputs", "reference model does not match the gear file (inputs",
        "bench", "{gear}", "--reference", "{conv}", "--iterations", "1", "--warmup", "0"),
    row("bench-reference-other-shapes", "the gear file feeds it [16, 64]", "bench",
        "{gear}", "--reference", "{other_prefill}", "--iterations", "1", "--warmup", "0"),
    row("bench-reference-fails-to-run", "it fails on gear 0's inputs", "bench", "{gear}",
        "--reference", "{other_prefill_symbolic}", "--iterations", "1", "--warmup", "0"),
    # bench --compare: the files are read like the loader reads a gear file, then validated
    *[row(f"compare-{id}", fragment, "bench", "--compare", before, "{result}")
      for id, fragment, before in [
        ("dev-zero", "not a regular file", "/dev/zero"),
        ("fifo", "not a regular file", "{fifo}"),
        ("directory", "it is a directory", "{tmp}"),
        ("huge-file", "more than the limit of", "{huge_json}"),
        ("deep-nesting", "nested deeper", "{deep_json}"),
        ("list", "not a JSON object", "{json:list}"),
        ("gears-not-a-list", "gears: expected a list", "{json:gears_str}"),
        ("gear-not-an-object", "gears[0]: expected an object", "{json:gear_int}"),
        ("samples-not-numbers", "gears[0].samples_ns.execute", "{json:samples_str}"),
        ("samples-null", "gears[0].samples_ns: expected an object", "{json:samples_null}"),
        ("samples-nan", "gears[0].samples_ns.execute", "{json:samples_nan}"),
        ("samples-inf", "gears[0].samples_ns.execute", "{json:samples_inf}"),
        ("samples-zero", "gears[0].samples_ns.execute", "{json:samples_zero}"),
        ("samples-negative", "gears[0].samples_ns.execute", "{json:samples_negative}"),
        ("too-many-samples", "gears[0].samples_ns.execute", "{json:samples_many}"),
        ("dims-not-a-list", "gears[0].dims", "{json:dims_str}"),
        ("context-not-an-object", "context: expected an object", "{json:context_list}"),
        ("machine-not-an-object", "context.machine: expected an object", "{json:machine_str}"),
    ]],
    row("compare-not-json", "not JSON", "bench", "--compare", "{garbage}", "{result}"),
    row("compare-plot-jpg", ".png", "bench", "--compare", "{result}", "{result}",
        "--plot", "{tmp}/cmp.jpg"),
    row("bench-plot-jpg", ".png", "bench", "{gear}", "--plot", "{tmp}/b.jpg"),
    # ---- demo
    row("demo-workdir-is-file", "cannot be created", "demo", "--workdir", "{garbage}"),
    row("demo-iterations-zero", "must be >= 1", "demo", "--iterations", "0"),
    # ---- check-padding: samples are checked before anything is allocated or run
    row("check-padding-missing-gear", "does not exist", "check-padding", "{tmp}/nope.gear.onnx",
        "{conv}"),
    row("check-padding-gear-fifo", "is not a file", "check-padding", "{fifo}", "{conv}"),
    row("check-padding-sample-huge", "[145013] sample (99999999, 99999999, 99999999, 16) is",
        "check-padding", "{gear}", "{prefill}", "--samples", "99999999"),
    row("check-padding-sample-negative", "'-3' is not a request size", "check-padding",
        "{gear}", "{prefill}", "--samples", "1,-3"),
    row("check-padding-sample-float", "'1.5' is not a request size", "check-padding",
        "{gear}", "{prefill}", "--samples", "1.5"),
    row("check-padding-samples-empty", "--samples '' is empty", "check-padding", "{gear}",
        "{prefill}", "--samples", ""),
    row("check-padding-sample-width", "has 2 values", "check-padding", "{gear}", "{prefill}",
        "--samples", "5,5"),
    row("check-padding-source-other-inputs", "the source model does not match the gear file",
        "check-padding", "{gear}", "{conv}"),
    row("check-padding-source-other-sizes", "the source model does not match the gear file",
        "check-padding", "{gear}", "{other_prefill}", "--samples", "5"),
    row("check-padding-source-garbage", "cannot be loaded by ONNX Runtime", "check-padding",
        "{gear}", "{garbage}"),
    row("check-padding-rtol-negative", "--rtol", "check-padding", "{gear}", "{prefill}",
        "--rtol", "-1"),
    row("check-padding-json-dir", "--json", "check-padding", "{gear}", "{prefill}",
        "--json", "{tmp}"),
    # ---- plan: every trace line is validated and named; bounded time and memory
    row("plan-missing-trace", "does not exist", "plan", "{conv}", "--input-shape",
        "data:-1,3,32,32", "--trace", "{tmp}/nope.csv", "--max-gears", "2"),
    row("plan-trace-fifo", "fifo", "plan", "{prefill}", "--input-shape", "{prefill_shape}",
        "--trace", "{fifo}", "--max-gears", "2"),
    *[row(f"plan-trace-{name}", fragment, "plan", "{prefill}", "--input-shape",
          "{prefill_shape}", "--trace", "{trace:" + name + "}", "--max-gears", "2")
      for name, fragment in [
        ("deep-json", "line 1: longer than 4096 characters"),
        ("nested", "line 2: nested deeper than a request"),
        ("inf", "line 2: inf is not an integer"),
        ("float", "line 2: 1.7 is not an integer"),
        ("bool", "line 2: true is not an integer"),
        ("nan", "line 2: NaN is not a request value"),
        ("zero", "line 2: 0 is out of range"),
        ("too-big", "line 2: 2147483648 is out of range"),
        ("widths", "line 2: 2 values; expected 1 value (seq_len)"),
        ("semicolon", "line 2: '1985;1986' is not a number"),
        ("unknown-name", "unknown 'seq'"),
        ("empty", "holds no requests"),
        ("garbage-bytes", "line 2:"),
    ]],
    row("plan-current-letters", "--current gear 'a,b'", "plan", "{prefill}", "--input-shape",
        "{prefill_shape}", "--trace", "{trace:good}", "--max-gears", "2", "--current", "a,b"),
    row("plan-current-zero", "gear values are >= 1", "plan", "{prefill}", "--input-shape",
        "{prefill_shape}", "--trace", "{trace:good}", "--max-gears", "2", "--current", "0"),
    row("plan-current-width", "--current gear '5,5'", "plan", "{prefill}", "--input-shape",
        "{prefill_shape}", "--trace", "{trace:good}", "--max-gears", "2", "--current", "5,5"),
    row("plan-input-not-in-model", "the model's inputs are", "plan", "{prefill}",
        "--input-shape", "tokens:1,-1", "--trace", "{trace:good}", "--max-gears", "2"),
    row("plan-input-shape-static", "no dynamic axis", "plan", "{prefill}", "--input-shape",
        "input_ids:1,5", "--trace", "{trace:good}", "--max-gears", "2"),
    row("plan-max-gears-zero", "must be >= 1", "plan", "{prefill}", "--input-shape",
        "{prefill_shape}", "--trace", "{trace:good}", "--max-gears", "0"),
    row("plan-dp-too-large", "DP cells", "plan", "{prefill}", "--input-shape",
        "{prefill_shape}", "--trace", "{trace:many}", "--max-gears", "200"),
    row("plan-json-dir", "--json", "plan", "{prefill}", "--input-shape", "{prefill_shape}",
        "--trace", "{trace:good}", "--max-gears", "2", "--json", "{tmp}"),
    # ---- serve (helper serve adds its rows here)
    row("serve-missing-file", "does not exist", "serve", "{tmp}/nope.gear.onnx"),
    row("serve-port-out-of-range", "not in 0..65535", "serve", "{gear}", "--port", "70000"),
    row("serve-port-not-a-number", "is not a port number", "serve", "{gear}", "--port", "http"),
    row("serve-grpc-port-negative", "not in 0..65535", "serve", "{gear}", "--grpc-port", "-1"),
    row("serve-nothing-to-serve", "--model-repository", "serve"),
    row("serve-repository-not-a-folder", "is not a folder", "serve", "--model-repository",
        "{gear}"),
    row("serve-ray-with-grpc", "--ray serves HTTP", "serve", "{gear}", "--ray",
        "--grpc-port", "0"),
    row("serve-garbage-file", "garbage", "serve", "{garbage}", "--port", "0"),
    row("serve-fifo", "fifo", "serve", "{fifo}", "--port", "0"),
    row("serve-header-timeout-zero", "must be a number >= 0.001", "serve", "{gear}",
        "--header-timeout", "0"),
    row("serve-folder-not-a-model", "without genai_config.json", "serve", "{tmp}"),
    row("llm-build-missing-checkpoint", "is not a folder", "llm", "build", "{tmp}/nope", "-o",
        "{tmp}/out"),
    row("llm-build-no-output", "-o/--output", "llm", "build", "{tmp}"),
    row("llm-build-zero-sequences", "must be", "llm", "build", "{tmp}", "-o", "{tmp}/o",
        "--max-sequences", "0"),
    row("llm-build-trace-and-gears", "not both", "llm", "build", "{tmp}", "-o", "{tmp}/o",
        "--trace", "{gear}", "--prompt-gears", "16"),
    # ---- completion
    row("completion-unknown-shell", "invalid choice: 'tcsh'", "completion", "tcsh"),
]


def _compare_variants(good: dict) -> dict[str, object]:
    """Crafted bench results: each breaks one field of a good one (``{json:<name>}``)."""
    def with_gear(**fields: object) -> dict:
        data = json.loads(json.dumps(good))
        data["gears"][0].update(fields)
        return data

    def with_samples(values: object) -> dict:
        data = json.loads(json.dumps(good))
        data["gears"][0]["samples_ns"]["execute"] = values
        return data

    n = len(good["gears"][0]["samples_ns"]["execute"])
    return {
        "list": [1, 2, 3],
        "gears_str": {**good, "gears": "all"},
        "gear_int": {**good, "gears": [7]},
        "samples_str": with_samples(["fast"] * n),
        "samples_null": with_gear(samples_ns=None),
        "samples_nan": with_samples([float("nan")] * n),
        "samples_inf": with_samples([float("inf")] * n),
        "samples_zero": with_samples([0] * n),
        "samples_negative": with_samples([-1000] * n),
        "samples_many": with_samples([1000] * 3_000_000),
        "dims_str": with_gear(dims="64"),
        "context_list": {**good, "context": []},
        "machine_str": {**good, "context": {**good["context"], "machine": "fast"}},
    }


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> dict[str, str]:
    """The files rows name: ``{gear}`` the prefill example compiled (dims mode, 4 inputs),
    ``{other_prefill}`` the same example with another hidden size (same input names),
    ``{other_prefill_symbolic}`` that model declaring a symbolic width (it fails to run),
    ``{inputs}`` its gear-1 inputs as ``--input`` flags, ``{ids}`` one of them, ``{conv}`` a
    plain ONNX model (batch), ``{result}`` a good bench JSON of ``{gear}``,
    ``{json:<variant>}`` crafted results, ``{fifo}``, ``{garbage}`` (random bytes),
    ``{empty}``, ``{truncated}`` (half a gear file), ``{huge_json}`` (sparse, past the
    bound), ``{deep_json}`` (100k-deep nesting), ``{tmp}`` a directory."""
    d = tmp_path_factory.mktemp("hostile")
    model_path, config_path = prefill.write_example(d)
    spec = gr.GearSpec.from_config(str(config_path))
    gear = d / "prefill.gear.onnx"
    gr.compile(str(model_path), spec, str(gear), progress=False)
    inputs = []
    for name, value in prefill.example_inputs(spec, 1, seed=1).items():
        np.save(d / f"{name}.npy", value)
        inputs.append(f"--input {name}={d / (name + '.npy')}")
    other_model, conv = d / "other_prefill.onnx", d / "conv.onnx"
    other = prefill.build_prefill_model(hidden=prefill.HIDDEN * 2)
    onnx.save(other, str(other_model))
    embeds = next(i for i in other.graph.input if i.name == "image_embeds")
    embeds.type.tensor_type.shape.dim[1].dim_param = "hidden"  # declares any width; runs 128
    onnx.save(other, str(d / "other_symbolic.onnx"))
    onnx.save(conv_model(), str(conv))
    assert CONV_BATCH_SPEC  # the conv model is the batch-mode example of tests/models.py
    from gear_runtime.tools.bench.engine import bench_model

    result = bench_model(str(gear), gears="0,1", iterations=5, warmup=0, progress=False,
                         inputs=lambda m, g: prefill.example_inputs(m.spec, g, seed=g))
    good = result.to_dict()
    out = {"tmp": str(d), "gear": str(gear), "conv": str(conv), "inputs": " ".join(inputs),
           "ids": str(d / "input_ids.npy"), "other_prefill": str(other_model),
           "other_prefill_symbolic": str(d / "other_symbolic.onnx")}
    (d / "result.json").write_text(json.dumps(good), encoding="utf-8")
    out["result"] = str(d / "result.json")
    for k, (name, data) in enumerate(_compare_variants(good).items()):
        p = d / f"crafted{k}.json"  # a neutral name: the fragments must not match the path
        p.write_text(json.dumps(data), encoding="utf-8")  # NaN / Infinity as JSON allows
        out[f"json:{name}"] = str(p)
    fifo = d / "fifo"
    os.mkfifo(fifo)
    out["fifo"] = str(fifo)
    garbage = d / "garbage.bin"
    garbage.write_bytes(np.random.default_rng(0).bytes(4096))
    out["garbage"] = str(garbage)
    garbage_npy = d / "garbage.npy"  # named .npy, holding no .npy (a .bin is raw values)
    garbage_npy.write_bytes(garbage.read_bytes())
    out["garbage_npy"] = str(garbage_npy)
    (d / "empty.onnx").write_bytes(b"")
    out["empty"] = str(d / "empty.onnx")
    blob = gear.read_bytes()
    (d / "truncated.gear.onnx").write_bytes(blob[: len(blob) // 2])
    out["truncated"] = str(d / "truncated.gear.onnx")
    huge = d / "huge.json"
    with open(huge, "wb") as f:  # sparse: no disk used
        f.truncate(3 * 2**30)
    out["huge_json"] = str(huge)
    (d / "deep.json").write_text("[" * 100_000 + "]" * 100_000, encoding="ascii")
    out["deep_json"] = str(d / "deep.json")
    out.update(_plan_files(d, model_path))
    out.update(_input_folders(d, spec))
    return out


def _input_folders(d: Path, spec: gr.GearSpec) -> dict[str, str]:
    """``{folders:<case>}``: ais_bench's --input of one folder per input of the prefill
    example (in input order, ',' between them), each breaking one rule: ``uneven`` (2 files
    in the last folder, 1 in the others), ``fifo`` (a FIFO named x.npy: never opened),
    ``garbage`` (random bytes named .npy), ``mixed`` (folders and a file), ``two`` (2 folders
    for 4 inputs)."""
    root = d / "folders"
    folders = []
    for name, value in prefill.example_inputs(spec, 1, seed=1).items():
        folder = root / name
        folder.mkdir(parents=True)
        np.save(folder / "0.npy", value)
        folders.append(folder)
    two, fifo, garbage = root / "two_files", root / "fifo", root / "garbage"
    for folder in (two, fifo, garbage):
        folder.mkdir()
    for k in range(2):  # the last input's files, twice
        np.save(two / f"{k}.npy", np.load(folders[-1] / "0.npy"))
    os.mkfifo(fifo / "x.npy")
    (garbage / "0.npy").write_bytes(np.random.default_rng(1).bytes(512))
    first = ",".join(map(str, folders[:3]))
    return {"folders:uneven": f"{first},{two}",
            "folders:fifo": f"{first},{fifo}",
            "folders:garbage": ",".join(map(str, [garbage, *folders[1:]])),
            "folders:mixed": f"{first},{folders[3] / '0.npy'}",
            "folders:two": ",".join(map(str, folders[:2]))}


def _plan_files(d: Path, model_path: Path) -> dict[str, str]:
    """``{prefill}`` (the example's source), ``{prefill_shape}`` (its input shape with the
    image tokens fixed: one tied value, seq_len) and ``{trace:<name>}`` trace files, each
    with one hostile line after a good one."""
    out = {"prefill": str(model_path), "prefill_shape": "input_ids:1,-1;attention_mask:1,-1;"
           "position_ids:4,1,-1;image_embeds:16,64"}
    second = {"nested": "[" * 1000 + "]" * 1000, "inf": "[1e999]", "float": "[1.7]",
              "bool": "[true]", "nan": "[NaN]", "zero": "0", "too-big": "2147483648",
              "widths": "5,6", "semicolon": "1985;1986", "unknown-name": '{"seq": 79}'}
    texts = {name: f"7\n{line}\n" for name, line in second.items()}
    texts.update({"deep-json": "[" * 100_000 + "]" * 100_000 + "\n", "empty": "\n\n",
                  "good": "5\n9\n17\n", "many": "".join(f"{v}\n" for v in range(1, 200_001))})
    for name, text in texts.items():
        (d / f"trace-{name}.txt").write_text(text, encoding="utf-8")
    (d / "trace-garbage-bytes.txt").write_bytes(b"7\n" + bytes(range(256)) * 4)
    for name in [*texts, "garbage-bytes"]:
        out[f"trace:{name}"] = str(d / f"trace-{name}.txt")
    return out


def _argv(r: Row, paths: dict[str, str]) -> list[str]:
    argv: list[str] = []
    for item in r.argv:
        if item == "{inputs}":  # several flags
            argv += paths["inputs"].split()
            continue
        for name, value in paths.items():
            item = item.replace("{" + name + "}", value)
        argv.append(item)
    return argv


def _limit_memory() -> None:  # runs in the child, before exec
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _params(rows: list[Row]) -> list:
    return [pytest.param(r, id=r.id, marks=[pytest.mark.xfail(strict=True, reason=r.todo)]
                         if r.todo else []) for r in rows]


@pytest.mark.parametrize("r", _params(ROWS))
def test_hostile_input_is_one_line_exit_2(r: Row, paths: dict[str, str]) -> None:
    argv = _argv(r, paths)
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    try:
        proc = subprocess.run([sys.executable, "-m", "gear_runtime.cli", *argv],
                              capture_output=True, text=True, timeout=TIME_LIMIT,
                              preexec_fn=_limit_memory, env=env, cwd=paths["tmp"])
    except subprocess.TimeoutExpired:
        pytest.fail(f"{r.id}: still running after {TIME_LIMIT:g} s: {argv}")
    err = proc.stderr
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"{r.id}: stderr is not one line:\n{err}"
    assert lines[0].startswith("gear-runtime: error:"), err
    assert "internal error" not in lines[0], err
    assert r.fragment.lower() in lines[0].lower(), (r.fragment, lines[0])
    assert proc.returncode == 2, (proc.returncode, err)


def test_every_command_has_rows() -> None:
    """Each command of the parser is exercised by at least one row (a new command gets rows)."""
    import argparse

    from gear_runtime.cli.app import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    covered = {r.argv[0] for r in ROWS if r.argv}
    missing = sorted(set(sub.choices) - covered)
    assert missing == [], f"commands without hostile rows: {missing}"


def test_the_last_resort_is_one_line_too(tmp_path: Path) -> None:
    """An exception nobody checked for (here a bug injected into a command) is still one
    line on stderr, 'internal error', and exit 1: never a traceback."""
    code = ("import sys, gear_runtime.cli.inspect as m\n"
            "def boom(args): raise ValueError('injected')\n"
            "m.cmd_inspect = boom\n"
            "from gear_runtime.cli.app import main\n"
            "sys.exit(main(['inspect', 'x']))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=TIME_LIMIT, cwd=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "internal error" in lines[0] and "ValueError" in lines[0] and "injected" in lines[0]
    assert proc.returncode == 1


def test_data_the_model_refuses_is_exit_2_in_one_line_without_orts_log(tmp_path, capfd) -> None:
    """A token id past an embedding table through `run`: one line, exit 2 (bad input), and
    none of ORT's own log lines (its environment logger is silenced for every command)."""
    import onnx
    from onnx import TensorProto, helper

    import gear_runtime as gr
    from gear_runtime.cli import main
    table = onnx.numpy_helper.from_array(np.zeros((4, 3), np.float32), "t")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["t", "ids"], ["y"])], "e",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2, 3])], initializer=[table])
    gear = str(tmp_path / "e.gear.onnx")
    gr.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                 ir_version=8),
               gr.GearSpec.from_atc("ids:-1,2", dynamic_batch_size="1,2"), gear, progress=False)
    np.save(tmp_path / "bad.npy", np.array([[1, 99]], np.int64))
    capfd.readouterr()
    code = main(["run", gear, "--input", f"ids={tmp_path / 'bad.npy'}", "--output-dir",
                 str(tmp_path)])
    err = capfd.readouterr().err  # file descriptor 2: ORT's C++ logger writes there
    assert code == 2 and err.count("\n") == 1 and "refused the request's data" in err
    assert "[E:onnxruntime" not in err
