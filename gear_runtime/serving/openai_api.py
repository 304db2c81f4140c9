"""OpenAI's completions and chat completions, decoded into a :class:`TextRequest` and
encoded from a :class:`Generation` (serving/generation.py): the JSON reply, or Server-Sent
Events chunk by chunk ending with ``data: [DONE]``.

What is taken, as OpenAI (and vLLM) name it: ``model``, ``prompt`` (text, token ids, or a
list of one of them) / ``messages`` (rendered with the folder's chat template),
``max_tokens`` (chat: also ``max_completion_tokens``), ``temperature``, ``top_p``, ``top_k``,
``stop_token_ids``, ``ignore_eos`` and ``return_token_ids`` (vLLM's extensions: each choice
and chunk then carries its ``token_ids``), ``seed``, ``stop`` (a string or a list),
``stream``, ``stream_options.include_usage``, ``n`` (1 only). What would change the result
and is not built (``n`` > 1, ``best_of``, ``echo``, ``logprobs``, penalties, ``logit_bias``,
``suffix``, tools) is refused by name, never ignored. Other fields (``user``, ...) are
ignored, as OpenAI's own API does with fields it does not use.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from gear_runtime.errors import InputError
from gear_runtime.serving.generation import Generation, ServedLlm, TextRequest

#: a completion's default max_tokens (OpenAI's)
COMPLETION_MAX_TOKENS = 16
#: stop strings a request may give
MAX_STOP_STRINGS = 16
_REFUSED = ("best_of", "echo", "logprobs", "top_logprobs", "suffix", "logit_bias", "tools",
            "tool_choice", "functions", "response_format")
_ZERO = ("presence_penalty", "frequency_penalty")


def completion_request(doc: dict[str, Any], served: ServedLlm) -> TextRequest:
    """``POST /v1/completions``'s body as a request of ``served``; InputError naming the
    field, its value and what is expected."""
    return _request(doc, served, _prompt_ids(doc.get("prompt"), served),
                    _max_tokens(doc, "max_tokens", COMPLETION_MAX_TOKENS))


def chat_request(doc: dict[str, Any], served: ServedLlm) -> TextRequest:
    """``POST /v1/chat/completions``'s body: the messages rendered with the folder's chat
    template (as transformers renders it), then encoded without adding special tokens
    again (the template wrote them)."""
    messages = doc.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InputError(f'"messages" must be a non-empty list of messages, got '
                         f"{_short(messages)}")
    text = served.tokenizer.apply_chat_template([_message(m, i) for i, m in
                                                 enumerate(messages)])
    ids = tuple(served.tokenizer.encode(text, add_special_tokens=False))
    key = "max_completion_tokens" if doc.get("max_completion_tokens") is not None \
        else "max_tokens"
    return _request(doc, served, ids, _max_tokens(doc, key, None))


def _request(doc: dict[str, Any], served: ServedLlm, ids: tuple[int, ...],
             max_tokens: int | None) -> TextRequest:
    for key in _REFUSED:
        if doc.get(key) not in (None, False, 0, [], {}):
            raise InputError(f'"{key}" is not supported by this server (got '
                             f"{_short(doc[key])})")
    for key in _ZERO:
        if doc.get(key) not in (None, 0, 0.0):
            raise InputError(f'"{key}" is not supported by this server: give 0 or leave it '
                             f"out (got {_short(doc[key])})")
    if doc.get("n") not in (None, 1):
        raise InputError(f'"n" must be 1 (one choice per request), got {_short(doc["n"])}')
    room = served.max_length - len(ids)
    if room < 1:
        raise InputError(f"the prompt has {len(ids)} tokens; the model's max_length is "
                         f"{served.max_length}, so at most {served.max_length - 1} fit")
    if max_tokens is None:
        max_tokens = room
    elif max_tokens > room:
        raise InputError(f'"max_tokens" {max_tokens} with a prompt of {len(ids)} tokens does '
                         f"not fit the model's max_length {served.max_length}: at most "
                         f"{room}")
    ignore_eos = doc.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise InputError(f'"ignore_eos" must be true or false, got {_short(ignore_eos)}')
    d = served.defaults
    top_k = _number(doc, "top_k", int, d["top_k"], -1, None)
    return TextRequest(
        prompt_ids=ids, max_tokens=max_tokens,
        temperature=_number(doc, "temperature", float, d["temperature"], 0.0, 2.0),
        top_p=_number(doc, "top_p", float, d["top_p"], 0.0, 1.0),
        top_k=0 if top_k == -1 else top_k,
        seed=_number(doc, "seed", int, None, None, None),
        stop=_stops(doc.get("stop")),
        stop_token_ids=_token_ids(doc.get("stop_token_ids", []), "stop_token_ids", served),
        ignore_eos=ignore_eos)


def token_ids_wanted(doc: dict[str, Any]) -> bool:
    """vLLM's ``return_token_ids``: the generated ids beside the text."""
    wanted = doc.get("return_token_ids", False)
    if not isinstance(wanted, bool | None):
        raise InputError(f'"return_token_ids" must be true or false, got {_short(wanted)}')
    return bool(wanted)


def stream_wanted(doc: dict[str, Any]) -> tuple[bool, bool]:
    """(stream, include usage in a last chunk)."""
    stream = doc.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise InputError(f'"stream" must be true or false, got {_short(stream)}')
    options = doc.get("stream_options") or {}
    if not isinstance(options, dict):
        raise InputError(f'"stream_options" must be an object, got {_short(options)}')
    usage = options.get("include_usage", False)
    if not isinstance(usage, bool):
        raise InputError(f'"stream_options.include_usage" must be true or false, got '
                         f"{_short(usage)}")
    return stream, usage


# ---- the answers ---------------------------------------------------------------------------
class Reply:
    """The documents of one answer (``chat``: chat.completion[.chunk], else
    text_completion)."""

    def __init__(self, model: str, chat: bool, token_ids: bool = False) -> None:
        self.model, self.chat, self.token_ids = model, chat, token_ids
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def _doc(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "choices": choices}

    def whole(self, text: str, generation: Generation) -> dict[str, Any]:
        """The non-streamed answer."""
        choice: dict[str, Any] = {"index": 0, "logprobs": None,
                                  "finish_reason": generation.finish_reason}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        if self.token_ids:
            choice["token_ids"] = list(generation.stream.tokens)
        doc = self._doc("chat.completion" if self.chat else "text_completion", [choice])
        doc["usage"] = usage(generation)
        return doc

    def chunk(self, text: str | None, finish: str | None, role: bool = False,
              token_ids: list[int] | None = None) -> dict[str, Any]:
        """One streamed chunk (``role``: chat's first, naming the assistant)."""
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
        if self.token_ids:
            choice["token_ids"] = token_ids or []
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        return self._doc("chat.completion.chunk" if self.chat else "text_completion",
                         [choice])

    def usage_chunk(self, generation: Generation) -> dict[str, Any]:
        doc = self._doc("chat.completion.chunk" if self.chat else "text_completion", [])
        doc["usage"] = usage(generation)
        return doc


def usage(generation: Generation) -> dict[str, int]:
    prompt, completion = generation.prompt_tokens, generation.completion_tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


async def events(reply: Reply, generation: Generation, include_usage: bool,
                 on_error: Any) -> AsyncIterator[bytes]:
    """The Server-Sent Events of a streamed answer: a chunk per delta with text (chat: a
    first one naming the role), the finish reason on the last, the usage chunk if asked,
    ``data: [DONE]``. An error mid-stream is one ``data: {"error": ...}`` event (what
    ``on_error(exc)`` makes of it), then the stream ends without [DONE]."""
    try:
        if reply.chat:
            yield sse(reply.chunk("", None, role=True))
        async for delta in generation:
            if delta.text or delta.finish_reason is not None or (
                    reply.token_ids and delta.token_ids):
                yield sse(reply.chunk(delta.text, delta.finish_reason,
                                      token_ids=delta.token_ids))
        if include_usage:
            yield sse(reply.usage_chunk(generation))
        yield b"data: [DONE]\n\n"
    except Exception as exc:  # noqa: BLE001 - answered in the stream, counted by on_error
        yield sse(on_error(exc))
    finally:
        await generation.aclose()


def sse(doc: dict[str, Any]) -> bytes:
    """One Server-Sent Event carrying ``doc`` as JSON."""
    return b"data: " + json.dumps(doc, ensure_ascii=False).encode() + b"\n\n"


def error_doc(exc: BaseException, status: int) -> dict[str, Any]:
    """OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""
    kind = {400: "invalid_request_error", 404: "not_found_error", 413: "invalid_request_error",
            503: "server_overloaded", 405: "invalid_request_error"}.get(status, "server_error")
    return {"error": {"message": str(exc), "type": kind, "param": None,
                      "code": getattr(exc, "code", None) or str(status)}}


# ---- fields --------------------------------------------------------------------------------
def _prompt_ids(prompt: Any, served: ServedLlm) -> tuple[int, ...]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise InputError('"prompt" is empty: give text or token ids')
        return served.encode(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return _token_ids(prompt, "prompt", served)
    if isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
        raise InputError(f'"prompt" holds {len(prompt)} prompts; this server takes one per '
                         "request (send them as separate requests: they run batched)")
    raise InputError(f'"prompt" must be a string or a list of token ids, got '
                     f"{_short(prompt)}")


def _token_ids(ids: Any, field: str, served: ServedLlm) -> tuple[int, ...]:
    vocab = served.engine.folder.vocab_size
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                            for t in ids):
        raise InputError(f'"{field}" must be a list of token ids, got {_short(ids)}')
    bad = next((t for t in ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise InputError(f'"{field}" holds token id {bad}, outside the vocabulary '
                         f"(0..{vocab - 1})")
    return tuple(ids)


def _message(message: Any, index: int) -> dict[str, str]:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise InputError(f'"messages[{index}]" must be an object with a "role" string, got '
                         f"{_short(message)}")
    content = message.get("content")
    if isinstance(content, list):  # OpenAI's content parts: the text ones, joined
        if not all(isinstance(p, dict) and p.get("type") == "text" and
                   isinstance(p.get("text"), str) for p in content):
            raise InputError(f'"messages[{index}].content": only text parts are supported, '
                             f"got {_short(content)}")
        content = "".join(p["text"] for p in content)
    if content is None:
        content = ""
    if not isinstance(content, str):
        raise InputError(f'"messages[{index}].content" must be a string, got '
                         f"{_short(content)}")
    return {"role": message["role"], "content": content}


def _max_tokens(doc: dict[str, Any], key: str, default: int | None) -> int | None:
    value = doc.get(key)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InputError(f'"{key}" must be a positive integer, got {_short(value)}')
    return value


def _number(doc: dict[str, Any], key: str, kind: type, default: Any, low: float | None,
            high: float | None) -> Any:
    value = doc.get(key)
    if value is None:
        return default
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if kind is int:
        ok = ok and float(value).is_integer()
    if not ok or (low is not None and value < low) or (high is not None and value > high):
        span = ("" if low is None and high is None else
                f" in [{low}, {high}]" if high is not None else f" >= {low}")
        what = "an integer" if kind is int else "a number"
        raise InputError(f'"{key}" must be {what}{span}, got {_short(value)}')
    return kind(value)


def _stops(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise InputError(f'"stop" must be a non-empty string or a list of them, got '
                         f"{_short(stop)}")
    if len(stops) > MAX_STOP_STRINGS:
        raise InputError(f'"stop" holds {len(stops)} strings; at most {MAX_STOP_STRINGS}')
    return tuple(stops)


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, bytes) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


__all__ = ["COMPLETION_MAX_TOKENS", "Reply", "chat_request", "completion_request",
           "error_doc", "events", "sse", "stream_wanted", "token_ids_wanted", "usage"]
