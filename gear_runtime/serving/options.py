"""How models are served: :class:`ServeOptions` (the ``gear-runtime serve`` flags), and the
largest request body a model needs (:func:`request_limit`, unless ``--max-body-mb``)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from gear_runtime.backends import facts
from gear_runtime.serving.protocol import json_width
from gear_runtime.serving.sequences import DEFAULT_IDLE_S

#: Default executors (worker threads) per model: one per core, at most 4 (ONNX Runtime's
#: own intra-op threads share the same cores). One on a one-core machine, not two: a second
#: executor there adds a session's memory and a thread contending for the one core, and it
#: would stop every run on the loop (a pool of two never lends: ExecutorPool.can_run_here),
#: taking from a short model at one client what the lending gains. What one executor risks,
#: a long run on the loop stalling every other client, the lending rule already excludes: a
#: run is lent only where its own gear was timed short (ExecutorPool).
DEFAULT_EXECUTORS = max(1, min(4, os.cpu_count() or 1))


#: sequence slots of a stateful model when --max-sequences is not given
DEFAULT_SEQUENCE_SLOTS = 4


@dataclass(frozen=True)
class ServeOptions:
    """How models are served (the ``gear-runtime serve`` flags)."""

    backend: str = "onnxruntime"
    executors: int = DEFAULT_EXECUTORS
    #: how long the first request of a batch waits for others; batching is for batch-mode
    #: models only
    max_batch_delay_ms: float = 2.0
    batching: bool = True
    #: a ``gear-runtime bench --json`` result of the model, measured where it is served: its
    #: gears' latencies become the batcher's costs (how many waiting requests a batch takes)
    profile: str | None = None
    #: the profile's digest was checked against the model's files already (by the parent
    #: of ``serve --workers``, once for all workers)
    profile_checked: bool = False
    #: requests waiting for an executor beyond which a model answers 503
    max_queue: int = 256
    #: dims mode: run requests of any shape padded to the covering gear
    #: (``execute(inputs, pad=True)``)
    pad: bool = False
    #: the largest request body; None: per model, from its largest gear (see request_limit)
    max_body_bytes: int | None = None
    #: wait out the batch delay even with an executor free, as Triton does (off: what waits
    #: goes as soon as an executor is free, so a lone request never pays the delay)
    batch_wait_when_idle: bool = False
    #: onnxruntime: let the intra-op threads spin while waiting for work (a little faster
    #: under load; an idle server then burns CPU); None: ORT's own thread count
    spin: bool = False
    intra_op_threads: int | None = None
    #: more ``gr.load`` options (``--device``, ``--config``, ``--input-shape``), as pairs
    device_options: tuple[tuple[str, Any], ...] = ()
    #: resident state pairs (input, output) of a stateful model (``--state past_kv=present_kv``):
    #: the model is served over Triton's sequence protocol (serving/sequences.py)
    state: tuple[tuple[str, str], ...] = ()
    #: sequences live at once (a stateful model: one executor each, None: 4; a causal LM
    #: folder: the engine's rows, None: what its build chose, else 8) and how long an idle
    #: one keeps its slot
    max_sequences: int | None = None
    sequence_idle_s: float = DEFAULT_IDLE_S
    #: this process's index under ``serve --workers`` (its metrics are labelled with it)
    worker: int | None = None
    #: the workers of this server (``serve --workers``; sequences are routed among them)
    workers: int = 1
    #: the folder the workers share: metrics snapshots (serving/metrics.py) and each
    #: worker's socket for the requests of sequences it holds (serving/peers.py)
    worker_dir: str | None = None
    #: the model a sequence_start request runs (a prefill gear file, padded to its covering
    #: gear), its outputs named like the state outputs written into the new sequence's state
    sequence_start: str | None = None
    #: keep each state pair in ONE buffer where the graph updates it in place
    #: (``create_executor(in_place_state=True)``: onnxruntime-genai's GroupQueryAttention)
    in_place_state: bool = False
    #: one log line per answered HTTP request (serving/logs.py, ``serve --access-log``)
    access_log: bool = False

    def load_options(self) -> dict[str, Any]:
        """The options ``gr.load`` gets for these serving options."""
        known = facts(self.backend)
        options: dict[str, Any] = {}
        if known.spin_keys:
            spin = "1" if self.spin else "0"
            options["session_config"] = dict.fromkeys(known.spin_keys, spin)
        if self.intra_op_threads is not None and known.threads_option:
            options[known.threads_option] = self.intra_op_threads
        options.update(self.device_options)
        return options


#: Room in a request body beyond its tensors' data: the JSON around them, names,
#: parameters, and per input.
REQUEST_HEADROOM = 64 * 2**10
REQUEST_HEADROOM_PER_INPUT = 2**10
#: The body limit of a model whose inputs have no upper bound (a hybrid model runs any
#: shape on its dynamic-shape graph), unless --max-body-mb says otherwise.
UNBOUNDED_MODEL_BODY_BYTES = 64 * 2**20


def request_limit(model: Any) -> int:
    """The largest body a request to ``model`` can need: the inputs of its largest gear, in
    the wider of their binary and their JSON encoding (elements x the widest JSON text of a
    value of the dtype, with separators and brackets), plus headroom for the rest."""
    if model.hybrid:
        return UNBOUNDED_MODEL_BODY_BYTES
    dtypes = [np.dtype(d) for d in model.info.input_dtypes]
    widest = 0
    for gear in range(model.gear_count):
        shapes = model.spec.shapes(gear)
        size = 0
        for name, dtype in zip(model.input_names, dtypes, strict=True):
            n = math.prod(shapes[name])
            size += n * max(dtype.itemsize, json_width(dtype, len(shapes[name])))
        widest = max(widest, size)
    return widest + REQUEST_HEADROOM + REQUEST_HEADROOM_PER_INPUT * len(dtypes)

