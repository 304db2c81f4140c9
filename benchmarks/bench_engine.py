"""Many sequences at once: the LLM engine against onnxruntime-genai (its batched Generator and
its Engine), openvino-genai's continuous batching and today's way, on the same weights, in one
interleaved run.

    python benchmarks/bench_engine.py [--model qwen3|gqa_lm] [--qwen-size bench|small]
                                      [--size bench|small] [--sequences 1,2,4,8,16]
                                      [--new 64] [--threads 2] [--rounds 2] [--workdir DIR]
                                      [--ways engine,genai,og-engine,ov-genai,per-sequence]
                                      [--ov-python PATH] [--json FILE]

The model (``--model``):

* ``qwen3`` (the default): a random Hugging Face ``Qwen3ForCausalLM``
  (:func:`gear_runtime.examples.hf_qwen3.write_random_qwen3`, float32) through the model
  builder (:func:`gear_runtime.llm.build.build_folder`: the onnxruntime-genai folder and the
  engine's gears, batch gears up to 16), and through optimum-intel for openvino-genai, all
  written into ``--workdir`` once and reused when present. ``--qwen-size bench``: vocab
  32,000, hidden 1024, 8 layers, 16 heads / 8 KV heads (head size 64), MLP 3072, context
  512: 166 M parameters (634 MiB of float32 weights); prompts of 40-200 tokens.
  ``small``: vocab 4000, hidden 256, 2 layers, 4 / 2 heads, MLP 768; prompts of 10-60.
* ``gqa_lm``: :mod:`gear_runtime.examples.gqa_lm` with a batch axis, written as an
  onnxruntime-genai folder (the builder's layout built with onnx.helper, GroupQueryAttention
  with the cache in place): ``--size bench`` hidden 1024, 8 layers, vocab 32,000, max_seq
  512, 167 M parameters; ``small`` the test size; prompts as above per size.

N prompts (seeded), ``--new`` tokens each, greedy, the end of sequence ignored; every way
gets the same prompts and ``--threads`` compute threads (ORT's intra-op threads, OpenVINO's
``INFERENCE_NUM_THREADS``), all submitted at once:

* ``engine``: :class:`gear_runtime.llm.Engine` (``max_sequences`` the largest N; the gears
  the build stored, else its defaults); its steady decode rate (decode tokens per second of
  decode steps alone, the prompts left out) is printed too;
* ``genai``: onnxruntime-genai, one ``Generator`` of batch N (prompts left-padded to the
  longest, one batched prefill), ``min_length`` forcing ``--new`` tokens;
* ``og-engine``: onnxruntime-genai's ``Engine``, a ``Request`` per prompt (``TurnOptions``:
  greedy, ``--new`` tokens min and max), events drained with ``Engine.run``. On the CPU its
  scheduler is the static batch one (``engine.static_batching.max_batch_size`` the largest
  N): dynamic batching needs a PagedAttention model, which the builder makes for CUDA only;
* ``ov-genai``: openvino-genai's ``ContinuousBatchingPipeline`` (CPU, f32 inference and
  KV cache, prefix caching off), in its own virtual environment (``--ov-python``, default
  ``$OV_GENAI_PYTHON`` or ``../ovenv/bin/python`` beside the repository) as a subprocess
  speaking JSON lines (``benchmarks/ov_genai_way.py``); token ids go in and come out, each
  token timed in the subprocess. Its OpenVINO IR is ``optimum-cli export openvino --task
  text-generation-with-past --weight-format fp32`` of the same checkpoint (``qwen3`` only);
* ``per-sequence``: today's way before the engine: one executor per sequence with its cache
  resident in place (gqa_lm's batch-1 gear file, prompt gears 32-256 and the step), a
  thread each, ORT's threads divided among them (``gqa_lm`` only: it runs gqa_lm's own
  feeds and cache pairs).

A way that cannot run here is left out with a printed reason; the others go on.

Per N and way (median over ``--rounds``; the ways' order rotates every round): aggregate
tokens/s (all generated tokens / wall time), per-token latency p50 / p99 (the gaps between a
sequence's tokens), time to first token p50 / max, and, per N, whether each way's greedy
tokens equal the engine's. Also this machine's ceiling measured in the same run: the weight
stream (the engine's steady step at N = 1, which reads every weight once for one token: the
floor of any step; the read bandwidth it implies is printed) and ORT's fp32 MatMul peak at
``--threads``; steady decode at N cannot beat ``N / max(stream, 2 * params * N / peak)``
tokens/s (prompts add their own compute on top). "vs genai": the engine's tokens/s over the
batched Generator's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

Result = dict[str, Any]

REPO = Path(__file__).resolve().parents[1]
#: the ways, in the table's order
WAYS = ("engine", "genai", "og-engine", "ov-genai", "per-sequence")
#: prompt lengths per size: (shortest, longest)
LENGTHS = {"bench": (40, 200), "small": (10, 60)}
#: write_random_qwen3's arguments per --qwen-size (head size hidden / heads, as Qwen3's 64-128)
QWEN3 = {"bench": {"vocab_size": 32000, "hidden": 1024, "layers": 8, "heads": 16,
                   "kv_heads": 8, "intermediate": 3072, "max_position": 512},
         "small": {"vocab_size": 4000, "hidden": 256, "layers": 2, "heads": 4,
                   "kv_heads": 2, "intermediate": 768, "max_position": 512}}
#: the batch gears the qwen3 build stores cover this many sequences (more compile at load)
BUILD_SEQUENCES = 16


@dataclass
class Setup:
    """One model as every way takes it: ``folder`` the onnxruntime-genai folder (the engine,
    genai, og-engine), ``hf`` the checkpoint (ov-genai's export; None for gqa_lm), ``gear``
    and ``sizes`` gqa_lm's batch-1 gear file and sizes (per-sequence; None for qwen3)."""

    name: str
    folder: Path
    vocab: int
    lengths: tuple[int, int]
    weight_bytes: int
    hf: Path | None = None
    gear: Path | None = None
    sizes: Any = None


def prompts_for(n: int, vocab: int, lengths: tuple[int, int], seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed + n)
    low, high = lengths
    return [rng.integers(1, vocab, int(rng.integers(low, high + 1))).tolist()
            for _ in range(n)]


def summarise(start: float, times: list[list[float]], wall: float) -> Result:
    """tokens/s, per-token p50/p99 (ms), TTFT p50/max (ms) from each sequence's token times."""
    gaps = [b - a for t in times for a, b in zip(t, t[1:], strict=False)]
    ttft = [t[0] - start for t in times if t]
    tokens = sum(len(t) for t in times)

    def pct(xs: list[float], q: float) -> float:
        return float(np.percentile(xs, q)) * 1e3 if xs else float("nan")

    return {"tokens_per_s": tokens / wall, "token_p50_ms": pct(gaps, 50),
            "token_p99_ms": pct(gaps, 99), "ttft_p50_ms": pct(ttft, 50),
            "ttft_max_ms": max(ttft) * 1e3 if ttft else float("nan")}


# ---- the ways: run(prompts, new) -> Result; tokens[N] the last run's tokens per prompt -------
class EngineWay:
    def __init__(self, folder: Path, cache: Path | None, max_n: int, threads: int) -> None:
        from gear_runtime.llm import Engine

        self.engine = Engine.from_folder(folder, max_sequences=max_n, cache_dir=cache,
                                         threads=threads)
        self.tokens: dict[int, list[list[int]]] = {}

    def run(self, prompts: list[list[int]], new: int) -> Result:
        start, streams, wall = self.generate(prompts, new)
        return summarise(start, [s.token_times for s in streams], wall)

    def generate(self, prompts: list[list[int]], new: int) -> tuple[float, list[Any], float]:
        """Every prompt submitted at once, ``new`` tokens each: (start, streams, wall s)."""
        start = time.perf_counter()
        streams = [self.engine.submit(p, new, stop_token_ids=[]) for p in prompts]
        self.tokens[len(prompts)] = [s.result() for s in streams]
        return start, streams, time.perf_counter() - start

    def close(self) -> None:
        self.engine.close()


def genai_model(folder: Path, threads: int, extra: dict[str, Any] | None = None) -> Any:
    """onnxruntime-genai's Model of ``folder`` on the CPU at ``threads`` intra-op threads.
    The settings go through ``Config.overlay``, never into the folder: the engine's gear key
    hashes ``genai_config.json``, so an edited file would compile its gears again."""
    import onnxruntime_genai as og

    config = og.Config(str(folder))
    config.clear_providers()
    overlay = {"model": {"decoder": {"session_options": {
        "intra_op_num_threads": threads, "inter_op_num_threads": 1}}}, **(extra or {})}
    config.overlay(json.dumps(overlay))
    return og.Model(config)


class GenaiWay:
    def __init__(self, folder: Path, threads: int) -> None:
        import onnxruntime_genai as og

        self.og = og
        self.model = genai_model(folder, threads)
        self.tokens: dict[int, list[list[int]]] = {}

    def run(self, prompts: list[list[int]], new: int) -> Result:
        og = self.og
        longest = max(len(p) for p in prompts)
        ids = np.zeros((len(prompts), longest), np.int32)  # 0: the pad id (genai_config)
        for r, p in enumerate(prompts):
            ids[r, longest - len(p):] = p  # left-padded, as genai pads a batch
        start = time.perf_counter()
        params = og.GeneratorParams(self.model)
        total = longest + new
        params.set_search_options(batch_size=len(prompts), max_length=total,
                                  min_length=total, do_sample=False)
        gen = og.Generator(self.model, params)
        gen.append_tokens(ids)
        times: list[float] = []
        while not gen.is_done():
            gen.generate_next_token()
            times.append(time.perf_counter())
        wall = time.perf_counter() - start
        self.tokens[len(prompts)] = [gen.get_sequence(r)[longest:].tolist()
                                     for r in range(len(prompts))]
        return summarise(start, [times] * len(prompts), wall)


class OgEngineWay:
    """onnxruntime-genai's ``Engine``: a Request per prompt, all begun before the first
    ``Engine.run``; each TOKEN event stamped when the run that returned it ends."""

    def __init__(self, folder: Path, threads: int, max_n: int) -> None:
        import onnxruntime_genai as og

        self.og = og
        # search.min_length must stay 0 for the Engine (its minimum is per turn)
        self.model = genai_model(folder, threads, {
            "engine": {"static_batching": {"max_batch_size": max_n}}})
        self.engine = og.Engine(self.model)
        self.events = self.engine.create_event_buffer(4 * max_n)
        self.tokens: dict[int, list[list[int]]] = {}

    def _request(self, prompt: list[int], new: int) -> Any:
        request = self.engine.create_request()
        turn = self.og.TurnOptions(request)
        turn.set_do_sample(False)
        turn.set_max_generated_tokens(new)
        turn.set_min_generated_tokens(new)  # masks the end of sequence: exactly `new` tokens
        request.begin_turn(np.asarray(prompt, np.int32), turn)
        return request

    def run(self, prompts: list[list[int]], new: int) -> Result:
        start = time.perf_counter()
        requests = [self._request(p, new) for p in prompts]
        row = {id(r): k for k, r in enumerate(requests)}
        tokens: list[list[int]] = [[] for _ in prompts]
        times: list[list[float]] = [[] for _ in prompts]
        while self.engine.has_pending_requests():
            self.engine.run(self.events)
            now = time.perf_counter()
            for i in range(len(self.events)):
                self._event(self.events[i], row, tokens, times, now)
        wall = time.perf_counter() - start
        for r in requests:
            r.close()
        self.tokens[len(prompts)] = tokens
        return summarise(start, times, wall)

    def _event(self, event: Any, row: dict[int, int], tokens: list[list[int]],
               times: list[list[float]], now: float) -> None:
        flags = self.og.EngineEventFlags
        if event.flags & flags.FAILED:
            raise RuntimeError(f"og.Engine request failed: {event.error_code}")
        if event.flags & flags.TOKEN:
            k = row[id(event.request)]
            tokens[k].append(int(event.token))
            times[k].append(now)


class OvGenaiWay:
    """openvino-genai's ContinuousBatchingPipeline in ``ov_python``'s environment, through
    ``benchmarks/ov_genai_way.py`` (JSON lines; its stderr into ``log``)."""

    def __init__(self, ov_python: Path, ir: Path, threads: int, max_n: int, log: Path) -> None:
        self.log = log
        command = [str(ov_python), str(REPO / "benchmarks" / "ov_genai_way.py"), "--ir",
                   str(ir), "--threads", str(threads), "--max-seqs", str(max_n)]
        with log.open("w") as err:
            self.proc = subprocess.Popen(command, stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=err, text=True)
        self.hello = self._reply()
        self.tokens: dict[int, list[list[int]]] = {}

    def _reply(self) -> dict[str, Any]:
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        reply = json.loads(line) if line.strip() else {}
        if "error" in reply or not reply:
            self.close()
            tail = self.log.read_text(errors="replace").strip().splitlines()[-3:]
            raise RuntimeError(reply.get("error") or f"ov_genai_way.py ended: {tail}")
        return reply

    def run(self, prompts: list[list[int]], new: int) -> Result:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"prompts": prompts, "new": new}) + "\n")
        self.proc.stdin.flush()
        reply = self._reply()
        self.tokens[len(prompts)] = reply["tokens"]
        return summarise(0.0, reply["times"], reply["wall"])  # times since its start

    def close(self) -> None:
        if self.proc.poll() is None and self.proc.stdin is not None:
            try:
                self.proc.stdin.write('{"quit": true}\n')
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # the subprocess this way started, by its own handle


class PerSequenceWay:
    def __init__(self, gear_file: Path, sizes: Any, threads: int, max_n: int) -> None:
        import gear_runtime as gr
        from gear_runtime.examples import gqa_lm

        self.gqa, self.sizes = gqa_lm, sizes
        self.model = gr.load(str(gear_file), intra_op_num_threads=threads)
        self.executors = [self.model.create_executor(state=gqa_lm.state_pairs(sizes),
                                                     in_place_state=True)
                          for _ in range(max_n)]
        self.tokens: dict[int, list[list[int]]] = {}

    def _one(self, ex: Any, prompt: list[int], new: int, times: list[float],
             out: list[int]) -> None:
        gqa, sizes = self.gqa, self.sizes
        ex.reset_state()
        ids = np.array([prompt], np.int64)
        (logits,) = ex.execute(gqa.prompt_feeds(ids, sizes), copy=False)
        out.append(int(logits[0, len(prompt) - 1].argmax()))
        times.append(time.perf_counter())
        for pos in range(len(prompt), len(prompt) + new - 1):
            (logits,) = ex.execute(gqa.step_feeds(out[-1], pos, sizes), copy=False)
            out.append(int(logits[0, 0].argmax()))
            times.append(time.perf_counter())

    def run(self, prompts: list[list[int]], new: int) -> Result:
        times: list[list[float]] = [[] for _ in prompts]
        outs: list[list[int]] = [[] for _ in prompts]
        start = time.perf_counter()
        threads = [threading.Thread(target=self._one, args=(self.executors[k], p, new,
                                                             times[k], outs[k]))
                   for k, p in enumerate(prompts)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - start
        self.tokens[len(prompts)] = outs
        return summarise(start, times, wall)


# ---- the machine's ceiling ----------------------------------------------------------------------
def _session(graph: Any, threads: int) -> Any:
    import onnxruntime as ort
    from onnx import helper

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    return ort.InferenceSession(helper.make_model(graph).SerializeToString(), so,
                                providers=["CPUExecutionProvider"])


def matmul_peak(threads: int) -> float:
    """ORT's fp32 MatMul peak (GFLOP/s, [256, 1024] x [1024, 4096] at ``threads``)."""
    from onnx import TensorProto, helper

    w = np.random.default_rng(0).standard_normal((1024, 4096)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [256, 1024])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [256, 4096])],
        [helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.tobytes(), raw=True)])
    sess = _session(graph, threads)
    x = np.ones((256, 1024), np.float32)
    sess.run(None, {"x": x})
    mm = min(_timed(lambda: sess.run(None, {"x": x})) for _ in range(10))
    return 2 * 256 * 1024 * 4096 / mm / 1e9


def ceiling(weight_bytes: int, step_floor: float, peak: float,
            counts: Sequence[int]) -> dict[str, float]:
    """Steady decode's ceiling at each N: ``N / max(step_floor, 2 * params * N / peak)``."""
    params = weight_bytes // 4
    return {"read_gb_s": weight_bytes / step_floor / 1e9, "matmul_gflop_s": peak,
            "step_floor_ms": step_floor * 1e3,
            **{f"ceiling_{n}": n / max(step_floor, 2 * params * n / (peak * 1e9))
               for n in counts}}


def _timed(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


# ---- the models -------------------------------------------------------------------------------
def build_gqa(workdir: Path, size: str) -> Setup:
    """gqa_lm's onnxruntime-genai folder and its batch-1 gear file (per-sequence)."""
    from gear_runtime.examples import gqa_lm
    from gear_runtime.gearfile.reader import read_gear_file

    sizes = gqa_lm.BENCH if size == "bench" else gqa_lm.SMALL
    folder = gqa_lm.write_genai_folder(workdir / "model", sizes, batch=True)
    _, gear = gqa_lm.write_model(workdir / "batch1", sizes)
    assert gear is not None
    return Setup(f"gqa_lm {size}", folder, sizes.vocab, LENGTHS[size],
                 read_gear_file(str(gear)).weight_bytes, gear=gear, sizes=sizes)


def build_qwen3(workdir: Path, size: str) -> Setup:
    """The random Qwen3 checkpoint and its builder folder under ``workdir/qwen3-<size>``,
    each written only where missing (the builder runs once per workdir)."""
    from gear_runtime.examples.hf_qwen3 import write_random_qwen3
    from gear_runtime.llm.build import build_folder
    from gear_runtime.llm.gears import GEARS_CONFIG

    root = workdir / f"qwen3-{size}"
    hf, folder = root / "hf", root / "model"
    if not (hf / "model.safetensors").is_file():
        _stage("checkpoint", lambda: write_random_qwen3(hf, **QWEN3[size]))
    if not (folder / GEARS_CONFIG).is_file():
        build_folder(hf, folder, max_sequences=BUILD_SEQUENCES,
                     progress=lambda line: print(f"  build: {line}", flush=True))
    weight_bytes = sum(p.stat().st_size for p in folder.glob("*.data"))
    return Setup(f"qwen3 {size}", folder, QWEN3[size]["vocab_size"], LENGTHS[size],
                 weight_bytes, hf=hf)


def export_ir(ov_python: Path, hf: Path, out: Path) -> Path:
    """optimum-intel's fp32 OpenVINO export of ``hf`` into ``out`` (kept when present),
    written beside it and renamed on success; RuntimeError quoting its last line."""
    if (out / "openvino_model.xml").is_file():
        return out
    staging = out.with_name(out.name + ".exporting")
    shutil.rmtree(staging, ignore_errors=True)
    command = [str(ov_python.parent / "optimum-cli"), "export", "openvino", "--model",
               str(hf), "--task", "text-generation-with-past", "--weight-format", "fp32",
               str(staging)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = _stage("optimum-cli export", lambda: subprocess.run(
        command, capture_output=True, text=True, env=env, check=False,
        stdin=subprocess.DEVNULL))
    if done.returncode != 0 or not (staging / "openvino_model.xml").is_file():
        last = (done.stdout + done.stderr).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"optimum-cli export failed (exit {done.returncode}): {last[0]}")
    staging.rename(out)
    return out


def _stage(what: str, step: Callable[[], Any]) -> Any:
    """``step()``, then one line with its seconds."""
    start = time.perf_counter()
    result = step()
    print(f"  {what} {time.perf_counter() - start:.1f} s", flush=True)
    return result


# ---- making the ways ------------------------------------------------------------------------
def make_way(name: str, setup: Setup, work: Path, args: argparse.Namespace,
             max_n: int) -> Any:
    """The way ``name`` on ``setup``; RuntimeError saying why where it cannot run here."""
    if name == "engine":
        return EngineWay(setup.folder, work / "cache", max_n, args.threads)
    if name == "genai":
        return GenaiWay(setup.folder, args.threads)
    if name == "og-engine":
        return OgEngineWay(setup.folder, args.threads, max_n)
    if name == "ov-genai":
        return _ov_way(setup, work, args, max_n)
    if name == "per-sequence":
        if setup.gear is None:
            raise RuntimeError("its executors run gqa_lm's own batch-1 gear file, feeds and "
                               "cache pairs, not a builder folder: use --model gqa_lm")
        return PerSequenceWay(setup.gear, setup.sizes, args.threads, max_n)
    raise RuntimeError(f"unknown way {name!r} (expected one of {', '.join(WAYS)})")


def _ov_way(setup: Setup, work: Path, args: argparse.Namespace, max_n: int) -> OvGenaiWay:
    if setup.hf is None:
        raise RuntimeError("it needs a Hugging Face checkpoint to export: use --model qwen3")
    ov_python = Path(args.ov_python)
    if not ov_python.is_file():
        raise RuntimeError(f"no Python at {ov_python} (--ov-python / $OV_GENAI_PYTHON: the "
                           "virtual environment with openvino-genai and optimum-intel)")
    ir = export_ir(ov_python, setup.hf, setup.folder.parent / "ov")
    way = OvGenaiWay(ov_python, ir, args.threads, max_n, work / "ov_genai_way.log")
    print(f"  ov-genai: {way.hello['versions']}, {way.hello['properties']}", flush=True)
    return way


def make_ways(names: Sequence[str], setup: Setup, work: Path, args: argparse.Namespace,
              max_n: int) -> dict[str, Any]:
    """The ways that start here, in ``names``' order; one printed line per way left out."""
    ways: dict[str, Any] = {}
    for name in names:
        try:
            ways[name] = _stage(f"{name} ready in", lambda n=name: make_way(
                n, setup, work, args, max_n))
        except Exception as exc:  # a peer that cannot run here must not stop the others
            print(f"way {name} left out: {type(exc).__name__}: {exc}", flush=True)
    return ways


# ---- the run --------------------------------------------------------------------------------
def run_rounds(ways: dict[str, Any], setup: Setup, counts: Sequence[int],
               args: argparse.Namespace) -> dict[tuple[int, str], list[Result]]:
    """Every way at every N for ``args.rounds`` rounds, the ways' order rotating per round."""
    results: dict[tuple[int, str], list[Result]] = {}
    order = list(ways)
    for r in range(args.rounds):
        for n in counts:
            prompts = prompts_for(n, setup.vocab, setup.lengths)
            for name in order[r % len(order):] + order[:r % len(order)]:
                result = _run_one(ways[name], prompts, args.new)
                results.setdefault((n, name), []).append(result)
                print(f"round {r} N={n} {name}: {result['tokens_per_s']:.1f} tok/s",
                      flush=True)
    return results


def _run_one(way: Any, prompts: list[list[int]], new: int) -> Result:
    """One run; for the engine, its steady decode rate over this run too."""
    before = _decode_stats(way)
    result = way.run(prompts, new)
    after = _decode_stats(way)
    if before is not None and after is not None and after[1] > before[1]:
        result["steady_tokens_per_s"] = (after[0] - before[0]) / (after[1] - before[1])
    return result


def _decode_stats(way: Any) -> tuple[int, float] | None:
    """(decode tokens, decode seconds) of an engine way so far; None for the others."""
    if not isinstance(way, EngineWay):
        return None
    st = way.engine.stats
    return st.step_sequences, st.decode_seconds


def check_tokens(ways: dict[str, Any], counts: Sequence[int]) -> dict[int, dict[str, str]]:
    """Per N, each other way's greedy tokens against the reference's (the engine, else the
    first way): "yes", or "no (k/N sequences equal)"; printed one line per N."""
    if not ways:
        return {}
    ref_name = "engine" if "engine" in ways else next(iter(ways))
    checks: dict[int, dict[str, str]] = {}
    for n in counts:
        ref = ways[ref_name].tokens.get(n)
        checks[n] = {}
        for name, way in ways.items():
            if name == ref_name or ref is None or n not in way.tokens:
                continue
            same = sum(a == b for a, b in zip(way.tokens[n], ref, strict=True))
            checks[n][name] = "yes" if same == n else f"no ({same}/{n} sequences equal)"
        listed = ", ".join(f"{w} {v}" for w, v in checks[n].items())
        print(f"N={n}: greedy tokens equal the {ref_name}'s: {listed or '(nothing to check)'}")
    return checks


def report(results: dict[tuple[int, str], list[Result]], counts: Sequence[int],
           order: Sequence[str], machine: dict[str, float]) -> list[Result]:
    rows = []
    print("\n| N | way | tokens/s | per-token p50 / p99 ms | TTFT p50 / max ms | vs genai |"
          " steady decode tok/s | decode ceiling tok/s |")
    print("|---|---|---|---|---|---|---|---|")
    for n in counts:
        med = {w: {k: statistics.median(r.get(k, float("nan")) for r in results[(n, w)])
                   for k in results[(n, w)][0]} for w in order if (n, w) in results}
        genai = med.get("genai", {}).get("tokens_per_s")
        for w, m in med.items():
            vs = f"{m['tokens_per_s'] / genai:.2f}x" if w == "engine" and genai else ""
            print(f"| {n} | {w} | {m['tokens_per_s']:.1f} | {m['token_p50_ms']:.1f} / "
                  f"{m['token_p99_ms']:.1f} | {m['ttft_p50_ms']:.0f} / {m['ttft_max_ms']:.0f} |"
                  f" {vs} | {m.get('steady_tokens_per_s', float('nan')):.0f} |"
                  f" {machine.get(f'ceiling_{n}', float('nan')):.0f} |")
            rows.append({"n": n, "way": w, **m})
    return rows


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=["qwen3", "gqa_lm"], default="qwen3")
    ap.add_argument("--qwen-size", choices=["bench", "small"], default="bench",
                    help="the Qwen3 checkpoint's size (--model qwen3)")
    ap.add_argument("--size", choices=["bench", "small"], default="bench",
                    help="gqa_lm's size (--model gqa_lm)")
    ap.add_argument("--sequences", default="1,2,4,8,16")
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--ways", default=",".join(WAYS))
    ap.add_argument("--ov-python", default=os.environ.get(
        "OV_GENAI_PYTHON", str(REPO.parent / "ovenv" / "bin" / "python")),
        help="the Python of the environment with openvino-genai and optimum-intel")
    ap.add_argument("--workdir", help="where the models are written (qwen3: reused there)")
    ap.add_argument("--json", help="write the results here")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    counts = [int(x) for x in args.sequences.split(",")]
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_engine_"))
    print(f"model {args.model}; in {work}", flush=True)
    setup = (build_qwen3(work, args.qwen_size) if args.model == "qwen3"
             else build_gqa(work, args.size))
    ways = make_ways(args.ways.split(","), setup, work, args, max(counts))
    try:
        peak = matmul_peak(args.threads)
        for way in ways.values():  # warm-up: every gear the runs touch, once
            way.run(prompts_for(min(4, max(counts)), setup.vocab, setup.lengths, seed=99), 4)
        results = run_rounds(ways, setup, counts, args)
        one = [r.get("steady_tokens_per_s") for r in results.get((1, "engine"), [])]
        floor = 1 / max(one) if one and all(one) else float("nan")
        machine = ceiling(setup.weight_bytes, floor, peak, counts)
        print(f"\nmodel: {setup.name}, {setup.weight_bytes / 2**20:.0f} MiB of weights; one "
              f"step at N = 1 {machine['step_floor_ms']:.1f} ms (reads "
              f"{machine['read_gb_s']:.1f} GB/s); ORT fp32 MatMul {peak:.0f} GFLOP/s at "
              f"{args.threads} threads", flush=True)
        table = report(results, counts, list(ways), machine)
        checks = check_tokens(ways, counts)
    finally:
        for way in ways.values():
            if hasattr(way, "close"):
                way.close()
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"model": setup.name, "machine": machine, "rows": table,
             "tokens_equal": {str(n): c for n, c in checks.items()}}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
