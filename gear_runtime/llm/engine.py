"""The engine: every live sequence's decode step in ONE run of the covering batch gear.

Each live sequence owns a row of the KV cache (one block per past / present pair, ``[rows,
kv heads, max_length, head size]``, updated in place by GroupQueryAttention): the live rows
are always the leading ones, so batch gear ``b`` runs rows ``0 .. b`` where they lie (no
cache byte copied per step). A step gathers the live sequences' last tokens and masks, runs
once on the smallest batch gear holding them (rows past the live ones are padding: token 0,
a mask of one position, in free rows nobody reads), and samples one token per sequence.

A new sequence takes the next free row: its prompt runs there in chunks on the prompt gears
(the smallest gear holding what is left, else the largest), then it joins the next step. A
sequence leaves the step it finishes (a stop token, ``max_new_tokens``, the cache's end, a
cancel); the last live row moves into its place (one row copy per finished sequence,
counted in :attr:`Engine.stats`).

Policy between prompts and steps (time to first token against inter-token latency): while
sequences decode, one waiting prompt at a time fills the next free row, one chunk of about
``prefill_chunk`` tokens (default 64: the prompt gear holding that many) between two steps,
so a step waits at most one chunk; it joins the step after its last chunk. In the steps
meanwhile its row, when the step's gear covers it, is a padding row whose one written
position is the one its next chunk overwrites. With nothing decoding, every waiting prompt
that has a row runs whole, one after another, and then all take their first token together
(no sequence waits between its first and second token for the prompts that came with
it). One thread runs it all (the engine's); :meth:`Engine.submit` and
:meth:`Engine.generate` may be called from any thread.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gear_runtime.errors import ClosedError, GearRuntimeError, InputError
from gear_runtime.llm.folder import ModelFolder, read_folder
from gear_runtime.llm.gears import LOGITS_INDEX, EngineGears, choose_gears, gear_file
from gear_runtime.llm.sampling import SamplingParams, SequenceSampler, sample

logger = logging.getLogger("gear_runtime.llm")

#: requests waiting for a row, at most (then submit raises EngineFullError)
DEFAULT_MAX_WAITING = 1024
#: the most prompt tokens run between two decode steps (about: a chunk is a prompt gear)
DEFAULT_PREFILL_CHUNK = 64


class EngineFullError(GearRuntimeError, RuntimeError):
    """Every row is live and the waiting queue is at its bound: retry later."""


@dataclass
class EngineStats:
    """What the engine did: decode steps, the live sequences they carried, each batch
    gear's count, prompt runs, time in prompts and in steps, and row copies."""

    steps: int = 0
    step_sequences: int = 0
    batch_gears: Counter[int] = field(default_factory=Counter)
    prompt_runs: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    row_copies: int = 0


class Stream:
    """One request's tokens as they come, ``finish_reason`` once it ends (``"stop"``,
    ``"length"``, ``"cancelled"``, ``"error"``); :meth:`cancel` ends it at the next step.

    Read it one way: iterate it (blocks), or, from an event loop, :meth:`on_update` plus
    :meth:`take` (never blocks)."""

    def __init__(self, engine: Engine, prompt: list[int], params: SamplingParams) -> None:
        self._engine = engine
        self.prompt = prompt
        self.params = params
        self.tokens: list[int] = []
        self.finish_reason: str | None = None
        self._queue: queue.SimpleQueue[int | BaseException | None] = queue.SimpleQueue()
        self._cancelled = threading.Event()
        self._done = threading.Event()
        self._error: BaseException | None = None
        #: perf_counter times: submitted, first token, each token as it was handed over
        self.submitted = time.perf_counter()
        self.first_token_at: float | None = None
        self.token_times: list[float] = []
        self._listener: Callable[[], None] | None = None

    def on_update(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` (from the engine's thread: it must not block) after each
        token and at the end; called once now, so nothing that came before is missed. An
        exception it raises is logged, never the engine's."""
        self._listener = listener
        self._notify()

    def take(self) -> tuple[list[int], bool]:
        """The tokens not yet taken and whether the stream has ended (all taken then),
        without waiting; raises the engine's error where it failed."""
        tokens: list[int] = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return tokens, False
            if item is None or isinstance(item, BaseException):
                self._queue.put(item)  # every later take ends (or raises) too
                if item is None:
                    return tokens, True
                if tokens:  # these first; the error with the next take
                    return tokens, False
                raise item
            tokens.append(item)

    def _notify(self) -> None:
        listener = self._listener
        if listener is not None:
            try:
                listener()
            except Exception:  # noqa: BLE001 - a reader's bug must not stop every stream
                logger.exception("a stream's listener failed")

    def cancel(self) -> None:
        """Stop generating: the sequence leaves (its row freed) at the engine's next step."""
        self._cancelled.set()
        self._engine._wake()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def __iter__(self) -> Iterator[int]:
        """The tokens not yet taken, as they come; ends with the sequence (raises the
        engine's error where it failed). Iterating again after the end yields nothing."""
        while True:
            item = self._queue.get()
            if item is None or isinstance(item, BaseException):
                self._queue.put(item)  # every later reader ends (or raises) too
                if item is None:
                    return
                raise item
            yield item

    def result(self) -> list[int]:
        """Every token of the sequence, once it ended (waits)."""
        self._done.wait()
        if isinstance(self._error, BaseException):
            raise self._error
        return list(self.tokens)

    # ---- the engine's side ---------------------------------------------------------------
    def _put(self, token: int) -> None:
        now = time.perf_counter()
        if self.first_token_at is None:
            self.first_token_at = now
        self.token_times.append(now)
        self.tokens.append(token)
        self._queue.put(token)
        self._notify()

    def _end(self, reason: str | BaseException) -> None:
        if isinstance(reason, BaseException):
            self.finish_reason, self._error = "error", reason
            self._queue.put(reason)
        else:
            self.finish_reason = reason
            self._queue.put(None)
        self._done.set()
        self._notify()


@dataclass
class _Live:
    """A sequence holding a row: its stream, sampler, and tokens in its cache row."""

    stream: Stream
    sampler: SequenceSampler
    length: int  # tokens written into its row of the cache


@dataclass
class _Filling:
    """A sequence whose prompt fills its row a chunk at a time between steps."""

    seq: _Live
    row: int
    done: int = 0  # prompt tokens written


class Engine:
    """Continuous batching on batch gears over one model folder (see the module doc)."""

    def __init__(self, folder: ModelFolder, gears: EngineGears, model: Any,
                 max_waiting: int = DEFAULT_MAX_WAITING,
                 prefill_chunk: int = DEFAULT_PREFILL_CHUNK) -> None:
        """``model``: the loaded gear file of :func:`gear_file` (a GearModel);
        ``prefill_chunk``: the most prompt tokens run between two steps (see the module
        doc)."""
        if isinstance(prefill_chunk, bool) or not isinstance(prefill_chunk, int) or \
                prefill_chunk < 1:
            raise InputError(f"prefill_chunk must be a positive integer, got {prefill_chunk!r}")
        self.prefill_chunk = prefill_chunk
        self._filling: _Filling | None = None
        self.folder, self.gears, self.model = folder, gears, model
        self._ex = model.create_executor(state=folder.state_pairs, in_place_state=True)
        self._rows: list[_Live] = []  # row i is self._rows[i]: the live rows lead
        self._waiting: deque[Stream] = deque()
        self._max_waiting = max_waiting
        self._cond = threading.Condition()
        self._closed = False
        self.stats = EngineStats()
        self._mask = np.zeros((gears.rows, gears.max_length), np.int64)
        self._thread = threading.Thread(target=self._loop, name="gear-llm-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_folder(cls, path: str | Path, max_sequences: int | None = None, *,
                    prompt_gears: Sequence[int] | None = None,
                    batch_gears: Sequence[int] | None = None, max_length: int | None = None,
                    cache_dir: str | Path | None = None, threads: int | None = None,
                    max_waiting: int = DEFAULT_MAX_WAITING,
                    prefill_chunk: int = DEFAULT_PREFILL_CHUNK) -> Engine:
        """An engine over an onnxruntime-genai builder folder: its gears chosen
        (:func:`~gear_runtime.llm.gears.choose_gears`: what is given, else what
        ``gear-runtime llm build`` stored in the folder, else the defaults; :attr:`gears`
        says which), compiled into the cache (or found there, or in the folder a build
        wrote), loaded on ONNX Runtime's CPU (``threads``: its intra-op threads)."""
        from gear_runtime.runtime.model import load

        folder = read_folder(path)
        gears = choose_gears(folder, max_sequences, prompt_gears, batch_gears, max_length)
        options: dict[str, Any] = {} if threads is None else {"intra_op_num_threads": threads}
        return cls(folder, gears, load(str(gear_file(folder, gears, cache_dir)), **options),
                   max_waiting, prefill_chunk)

    # ---- requests ------------------------------------------------------------------------
    def submit(self, prompt: Sequence[int], max_new_tokens: int = 16, *,
               temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
               seed: int | None = None, stop_token_ids: Sequence[int] | None = None) -> Stream:
        """A new sequence from ``prompt`` (token ids): its :class:`Stream`. It joins the
        running ones as soon as a row is free. ``stop_token_ids`` default: the model's end
        of sequence. InputError (naming the value and the limit) for a bad request, which
        fails alone; EngineFullError when the waiting queue is full; ClosedError after
        :meth:`close`."""
        params = SamplingParams(
            max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
            seed=seed, stop_token_ids=tuple(self.folder.eos_token_ids if stop_token_ids is None
                                            else stop_token_ids))
        params.check_vocab(self.folder.vocab_size)
        ids = self._check_prompt(prompt, params)
        stream = Stream(self, ids, params)
        with self._cond:
            if self._closed:
                raise ClosedError("submit on a closed engine")
            if len(self._waiting) >= self._max_waiting:
                raise EngineFullError(f"{len(self._waiting)} requests wait for a row "
                                      f"(max_waiting {self._max_waiting}): retry later")
            self._waiting.append(stream)
            self._cond.notify()
        return stream

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int = 16,
                 **sampling: Any) -> list[list[int]]:
        """Every prompt's generated tokens, in order, all run at once (see :meth:`submit`;
        a bad prompt raises before any is submitted)."""
        for p in prompts:  # all checked first: nothing runs for a batch holding a bad one
            self._check_prompt(p, SamplingParams(max_new_tokens=max_new_tokens))
        streams = [self.submit(p, max_new_tokens, **sampling) for p in prompts]
        return [s.result() for s in streams]

    def _check_prompt(self, prompt: Sequence[int], params: SamplingParams) -> list[int]:
        try:
            ids = [int(t) for t in prompt]
        except (TypeError, ValueError):
            raise InputError(f"a prompt is a list of token ids, got {prompt!r:.80}") from None
        if not ids:
            raise InputError("the prompt is empty: give at least one token id")
        bad = next((t for t in ids if not 0 <= t < self.folder.vocab_size), None)
        if bad is not None:
            raise InputError(f"the prompt holds token id {bad}, outside the vocabulary "
                             f"(0..{self.folder.vocab_size - 1})")
        room = self.gears.max_length - params.max_new_tokens
        if len(ids) > room:
            raise InputError(f"a prompt of {len(ids)} tokens with max_new_tokens "
                             f"{params.max_new_tokens} does not fit max_length "
                             f"{self.gears.max_length}: at most {max(room, 0)} prompt tokens")
        return ids

    @property
    def live(self) -> int:
        """Sequences holding a row now."""
        return len(self._rows)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def close(self) -> None:
        """Stop: sequences still running or waiting end (finish_reason ``"cancelled"``); the
        model is closed. Idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        self._thread.join()
        self.model.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    # ---- the engine's thread ---------------------------------------------------------------
    def _loop(self) -> None:
        ending: str | BaseException = "cancelled"
        try:
            while True:
                with self._cond:
                    while not self._closed and not self._waiting and not self._rows \
                            and self._filling is None:
                        self._cond.wait()
                    if self._closed:
                        break
                    joining = self._take_waiting()
                self._join(joining)  # nothing decodes: whole prompts, one after another
                self._fill()
                self._drop_cancelled()
                if self._rows:
                    self._step()
        except BaseException as exc:  # noqa: BLE001 - a bug must end every stream, not hang
            ending = exc
            with self._cond:
                self._closed = True
        for seq in self._rows:
            seq.stream._end(ending)
        if self._filling is not None:
            self._filling.seq.stream._end(ending)
            self._filling = None
        with self._cond:
            for stream in self._waiting:
                stream._end(ending)
            self._waiting.clear()
        self._rows.clear()

    def _take_waiting(self) -> list[Stream]:
        """With nothing decoding, the waiting requests that take a row now, their prompts
        run whole; while sequences decode, the next one starts filling the next free row
        (:meth:`_fill`). Cancelled ones end here."""
        if self._filling is not None:
            return []
        free = self.gears.rows - len(self._rows)
        out: list[Stream] = []
        while self._waiting and len(out) < free:
            stream = self._waiting.popleft()
            if stream.cancelled:
                stream._end("cancelled")
                continue
            if self._rows:  # others decode: this one fills its row between their steps
                seq = _Live(stream, SequenceSampler(stream.params), 0)
                self._filling = _Filling(seq, len(self._rows))
                return []
            out.append(stream)
        return out

    def _fill(self) -> None:
        """One chunk (at most :attr:`prefill_chunk` tokens while others decode; the rest of
        the prompt when none does) of the prompt filling its row; once it is whole, the
        sequence moves to the next live row (a row copy when others left meanwhile), takes
        its first token and decodes with the others."""
        f = self._filling
        if f is None:
            return
        stream = f.seq.stream
        if stream.cancelled:
            stream._end("cancelled")
            self._filling = None
            return
        start = time.perf_counter()
        try:
            while True:
                logits, f.done = self._prefill_chunk(f.row, stream.prompt, f.done,
                                                     self.prefill_chunk if self._rows else None)
                if f.done == len(stream.prompt) or self._rows:
                    break
        except GearRuntimeError as exc:  # a request the runtime refused fails alone
            stream._end(exc)
            self._filling = None
            return
        finally:
            self.stats.prefill_seconds += time.perf_counter() - start
        if f.done < len(stream.prompt):
            return
        self._filling = None
        row = len(self._rows)  # rows only left while it filled: f.row >= row
        if f.row != row:
            self._ex.copy_state_rows(f.row, row)
            self.stats.row_copies += 1
        self._admit(f.seq, logits)

    def _join(self, streams: list[Stream]) -> None:
        """Prompts taken while nothing decodes: each runs whole into the next free row, then
        all take their first token together and decode from the next step. Together, as
        one prefill step of vLLM's holds every prompt that fits its budget: a sequence never
        waits between its first and second token for the prompts that came with it (that
        wait, not the prompt, would be its stream's longest pause)."""
        ready: list[tuple[_Live, np.ndarray]] = []
        for stream in streams:
            row = len(self._rows) + len(ready)
            start = time.perf_counter()
            try:
                done, logits = 0, None
                while done < len(stream.prompt):
                    logits, done = self._prefill_chunk(row, stream.prompt, done, None)
            except GearRuntimeError as exc:  # a request the runtime refused fails alone
                stream._end(exc)  # (its row is the next one's: overwritten)
                continue
            finally:
                self.stats.prefill_seconds += time.perf_counter() - start
            assert logits is not None
            ready.append((_Live(stream, SequenceSampler(stream.params), len(stream.prompt)),
                          logits))
        if not ready:
            return
        first = len(self._rows)
        self._rows += [seq for seq, _ in ready]
        tokens = sample(np.concatenate([lg for _, lg in ready]), [s.sampler for s, _ in ready])
        finished = []
        for i, ((seq, _), token) in enumerate(zip(ready, tokens.tolist(), strict=True)):
            if self._emit(seq, token):
                finished.append(first + i)
        self._leave(finished)

    def _admit(self, seq: _Live, logits: np.ndarray) -> None:
        """A sequence whose prompt is whole in the next live row: its first token, sampled
        from the prompt's last logits; it decodes from the next step unless that ended it."""
        seq.length = len(seq.stream.prompt)
        token = int(sample(logits, [seq.sampler])[0])
        self._rows.append(seq)
        if self._emit(seq, token):
            self._leave([len(self._rows) - 1])

    def _prefill_chunk(self, row: int, prompt: list[int], done: int,
                       limit: int | None) -> tuple[np.ndarray, int]:
        """The next chunk of ``prompt`` (after ``done`` tokens; at most about ``limit``)
        written into row ``row``: its last token's logits [1, vocab] and the tokens done."""
        left = len(prompt) - done
        gear = self._prompt_gear(done, left if limit is None else min(left, limit))
        chunk = prompt[done:done + min(gear, left)]
        ids = np.zeros((1, gear), np.int64)
        ids[0, :len(chunk)] = chunk
        mask = np.zeros((1, self.gears.max_length), np.int64)
        mask[0, :done + gear] = 1  # the pads after the chunk are overwritten before read
        feeds = {self.folder.input_ids: ids, self.folder.attention_mask: mask,
                 LOGITS_INDEX: np.array([len(chunk) - 1], np.int64)}
        if self.folder.position_ids:
            feeds[self.folder.position_ids] = np.arange(done, done + gear)[None]
        (logits,) = self._ex.execute(feeds, first_row=row)
        self.stats.prompt_runs += 1
        self.stats.prompt_tokens += len(chunk)
        return logits[:, 0], done + len(chunk)

    def _prompt_gear(self, done: int, want: int) -> int:
        """Tokens of the next chunk's gear: the smallest prompt gear holding ``want``
        tokens, else the largest; one that would write past the cache's end is skipped (the
        batch gear 1, a single token, always fits)."""
        room = self.gears.max_length - done
        fits = [g for g in self.gears.prompt if g <= room]
        return next((g for g in fits if g >= want), fits[-1] if fits else 1)

    def _step(self) -> None:
        """One decode step of every live sequence on the covering batch gear."""
        live = len(self._rows)
        batch = next(b for b in self.gears.batch if b >= live)
        ids = np.zeros((batch, 1), np.int64)
        mask = self._mask[:batch]
        mask.fill(0)
        mask[live:, 0] = 1  # padding rows: one position, in free rows
        f = self._filling
        if f is not None and f.row < batch:  # at its length: the next chunk writes there
            mask[f.row, :f.done + 1] = 1
        for r, seq in enumerate(self._rows):
            ids[r, 0] = seq.stream.tokens[-1]
            mask[r, :seq.length + 1] = 1
        feeds = {self.folder.input_ids: ids, self.folder.attention_mask: mask,
                 LOGITS_INDEX: np.zeros(1, np.int64)}
        if self.folder.position_ids:
            feeds[self.folder.position_ids] = np.array(
                [[s.length] for s in self._rows] + [[0]] * (batch - live), np.int64)
        start = time.perf_counter()
        (logits,) = self._ex.execute(feeds, copy=False)
        tokens = sample(logits[:live, 0], [s.sampler for s in self._rows])
        self.stats.decode_seconds += time.perf_counter() - start
        self.stats.steps += 1
        self.stats.step_sequences += live
        self.stats.batch_gears[batch] += 1
        finished = []
        for r, (seq, token) in enumerate(zip(self._rows, tokens.tolist(), strict=True)):
            seq.length += 1
            if self._emit(seq, token):
                finished.append(r)
        self._leave(finished)

    def _emit(self, seq: _Live, token: int) -> bool:
        """Hand ``token`` to the sequence's stream; whether the sequence ends with it."""
        seq.stream._put(token)
        self.stats.generated_tokens += 1
        p = seq.stream.params
        reason = ("stop" if token in p.stop_token_ids else
                  "length" if len(seq.stream.tokens) >= p.max_new_tokens
                  or seq.length >= self.gears.max_length else None)
        if reason is not None:
            seq.stream._end(reason)
        return reason is not None

    def _leave(self, rows: list[int]) -> None:
        """The sequences of ``rows`` leave; the last live row moves into each hole."""
        for r in sorted(rows, reverse=True):
            last = len(self._rows) - 1
            if r != last:
                self._ex.copy_state_rows(last, r)
                self._rows[r] = self._rows[last]
                self.stats.row_copies += 1
            self._rows.pop()

    def _drop_cancelled(self) -> None:
        """Cancelled sequences end and leave before the next step."""
        gone = [r for r, seq in enumerate(self._rows) if seq.stream.cancelled]
        for r in gone:
            self._rows[r].stream._end("cancelled")
        self._leave(gone)


__all__ = ["DEFAULT_MAX_WAITING", "DEFAULT_PREFILL_CHUNK", "Engine", "EngineFullError",
           "EngineStats", "Stream"]
