"""The text side of the server: a causal LM's folder served through the engine.

:class:`ServedLlm` is one model folder behind the text routes (OpenAI's completions and chat
in serving/openai_api.py, Triton's generate in serving/triton_generate.py): the engine
(continuous batching on batch gears, :mod:`gear_runtime.llm.engine`) and the folder's
tokenizer. A front end decodes its protocol into a :class:`TextRequest`, calls
:meth:`ServedLlm.start` (a bad request or a full engine raises here, before any byte of the
reply) and reads the :class:`Generation`'s text deltas, each as soon as the engine made its
token. Closing a generation early (the client went away, a stop string matched) frees its
row at the engine's next step.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gear_runtime.errors import InputError
from gear_runtime.serving.errors import OverloadedError

#: what the engine's finish reasons are called on the wire (OpenAI's, and vLLM's "abort"
#: for a sequence the server ended: a drain past its deadline, a shutdown)
FINISH_REASONS = {"stop": "stop", "length": "length", "cancelled": "abort"}
#: sampling defaults when the folder's generation_config.json gives none (OpenAI's)
DEFAULT_TEMPERATURE = 1.0


@dataclass(frozen=True)
class TextRequest:
    """One generation, whatever protocol asked for it."""

    prompt_ids: tuple[int, ...]
    max_tokens: int
    temperature: float
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    #: strings that end the text (not included in it)
    stop: tuple[str, ...] = ()
    #: token ids that end it besides the model's end of sequence
    stop_token_ids: tuple[int, ...] = ()
    #: the model's end of sequence does not end it (vLLM's ``ignore_eos``: benchmarks)
    ignore_eos: bool = False


@dataclass
class TextDelta:
    """What one read of a generation brought: new text, its token ids, and on the last
    delta the finish reason ("stop", "length", "abort")."""

    text: str
    token_ids: list[int]
    finish_reason: str | None = None


class Generation:
    """One running request's text as it comes (``async for delta in generation``); its
    counts once ended. :meth:`aclose` ends it early: the engine drops its sequence at the
    next step."""

    def __init__(self, served: ServedLlm, stream: Any, request: TextRequest) -> None:
        self.served, self.stream, self.request = served, stream, request
        self.completion_tokens = 0
        self.finish_reason: str | None = None
        self._iterator = self._deltas()

    @property
    def prompt_tokens(self) -> int:
        return len(self.request.prompt_ids)

    def __aiter__(self) -> AsyncIterator[TextDelta]:
        return self._iterator

    async def aclose(self) -> None:
        """End reading (idempotent); a sequence still running leaves the engine at its next
        step, also when nobody ever read it (a client gone before its reply started)."""
        await self._iterator.aclose()
        self._done_reading(ended=self.stream.finish_reason is not None)

    async def text(self) -> str:
        """The whole text (waits for the end)."""
        return "".join([d.text async for d in self])

    async def _deltas(self) -> AsyncGenerator[TextDelta, None]:
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()
        stream = self.stream
        detok = self.served.tokenizer.detokenizer(self.request.prompt_ids)
        stops = _stop_strings(self.request.stop)
        ended = False
        stream.on_update(lambda: loop.call_soon_threadsafe(ready.set))
        try:
            while self.finish_reason is None:
                await ready.wait()
                ready.clear()
                tokens, ended = stream.take()
                if not tokens and not ended:
                    continue
                self.completion_tokens += len(tokens)
                text = "".join(detok.push(t) for t in tokens) + (detok.flush() if ended else "")
                finish = FINISH_REASONS.get(stream.finish_reason or "", "abort") if ended \
                    else None  # (an ended stream always has a reason: the loop ends)
                if stops is not None:
                    text, matched = stops.push(text)
                    if matched:
                        finish = "stop"
                    elif ended:
                        text += stops.flush()
                self.finish_reason = finish
                if tokens:
                    self.served.delivered(stream)
                yield TextDelta(text, tokens, finish)
        finally:
            self._done_reading(ended)

    def _done_reading(self, ended: bool) -> None:
        if not ended:
            self.stream.cancel()  # a stop string, or the reader went away: free the row
        self.served.finished(self)


def _stop_strings(stops: Sequence[str]) -> Any:
    if not stops:
        return None
    from gear_runtime.llm.tokenizer import StopStrings

    return StopStrings(stops)


class ServedLlm:
    """One causal LM folder behind the text routes: the engine, the tokenizer, the
    sampling defaults, the metrics. Created by :meth:`load`."""

    def __init__(self, name: str, path: Path, engine: Any, tokenizer: Any, metrics: Any,
                 defaults: dict[str, Any]) -> None:
        self.name, self.path, self.engine, self.tokenizer = name, path, engine, tokenizer
        self.metrics, self.defaults = metrics, defaults
        self.created = int(time.time())
        #: generations reading now (a drain waits for them; past its deadline they end)
        self.running: set[Generation] = set()
        #: the model's end of sequence and the tokenizer's (a chat turn's end, <|im_end|>)
        self.stop_ids = tuple(dict.fromkeys((*engine.folder.eos_token_ids,
                                             *tokenizer.eos_token_ids)))
        metrics.track_llm(name, lambda: engine.live, lambda: engine.waiting,
                          lambda: engine.live / engine.gears.rows)

    @classmethod
    def load(cls, name: str, path: str, options: Any, metrics: Any) -> ServedLlm:
        """The folder ``path`` (an onnxruntime-genai builder folder with its tokenizer):
        its engine (``options``: max_sequences, max_queue as the engine's waiting bound,
        intra_op_threads) and tokenizer. InputError naming what is missing."""
        from gear_runtime.llm.engine import Engine
        from gear_runtime.llm.tokenizer import Tokenizer

        folder = Path(path)
        tokenizer = Tokenizer.from_folder(folder)
        engine = Engine.from_folder(folder, max_sequences=options.max_sequences,
                                    threads=options.intra_op_threads,
                                    max_waiting=options.max_queue)
        try:
            if tokenizer.vocab_size > engine.folder.vocab_size:
                raise InputError(f"{folder}: the tokenizer has {tokenizer.vocab_size} ids, "
                                 f"the model's vocabulary {engine.folder.vocab_size}")
            return cls(name, folder, engine, tokenizer, metrics, _generation_defaults(folder))
        except BaseException:
            engine.close()
            raise

    @property
    def max_length(self) -> int:
        return int(self.engine.gears.max_length)

    def start(self, request: TextRequest) -> Generation:
        """Submit ``request``; its generation. InputError for a request the engine refuses
        (naming the value and the limit), OverloadedError (503) when its queue is full."""
        from gear_runtime.llm.engine import EngineFullError

        try:
            stream = self.engine.submit(
                list(request.prompt_ids), request.max_tokens,
                temperature=request.temperature, top_k=request.top_k, top_p=request.top_p,
                seed=request.seed,
                stop_token_ids=tuple(dict.fromkeys(
                    (*(() if request.ignore_eos else self.stop_ids), *request.stop_token_ids))))
        except EngineFullError as exc:
            raise OverloadedError(str(exc)) from None
        generation = Generation(self, stream, request)
        self.running.add(generation)
        return generation

    def encode(self, text: str) -> tuple[int, ...]:
        """A text prompt's token ids (the tokenizer's special tokens added as it says)."""
        return tuple(self.tokenizer.encode(text))

    def delivered(self, stream: Any) -> None:
        """A stream's token reached its reader: how long after the engine made it."""
        self.metrics.llm_delivery(self.name, time.perf_counter() - stream.token_times[-1])

    def finished(self, generation: Generation) -> None:
        """Count a generation that ended (or was closed)."""
        if generation not in self.running:
            return
        self.running.discard(generation)
        s = generation.stream
        self.metrics.llm_request(self.name, s.submitted, s.first_token_at, s.token_times,
                                 generation.prompt_tokens, generation.completion_tokens,
                                 generation.finish_reason or "abort")

    def end_running(self) -> None:
        """Past the drain deadline: every running generation ends at the next step (its
        last delta says ``finish_reason: "abort"``)."""
        for generation in list(self.running):
            generation.stream.cancel()

    def describe(self) -> dict[str, Any]:
        """An entry of ``GET /v1/models``."""
        return {"id": self.name, "object": "model", "created": self.created,
                "owned_by": "gear_runtime", "max_model_len": self.max_length}

    async def close(self) -> None:
        self.metrics.untrack_llm(self.name)
        await asyncio.to_thread(self.engine.close)


def _generation_defaults(folder: Path) -> dict[str, Any]:
    """Sampling defaults from the checkpoint's generation_config.json (as vLLM takes
    them), else OpenAI's (temperature 1)."""
    defaults: dict[str, Any] = {"temperature": DEFAULT_TEMPERATURE, "top_p": 1.0, "top_k": 0}
    from gear_runtime.llm.folder import read_json_object

    doc = read_json_object(folder / "generation_config.json")
    for key in ("temperature", "top_p", "top_k"):
        value = doc.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            defaults[key] = value
    if doc.get("do_sample") is False:  # greedy, whatever temperature it also names
        defaults["temperature"] = 0.0
    return defaults


def is_llm_folder(path: str) -> bool:
    """Whether ``path`` is a folder the text routes serve (a genai_config.json in it)."""
    from gear_runtime.llm.folder import CONFIG

    return (Path(path) / CONFIG).is_file()


__all__ = ["FINISH_REASONS", "Generation", "ServedLlm", "TextDelta", "TextRequest",
           "is_llm_folder"]
