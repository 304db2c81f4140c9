"""Triton's generate extension: ``POST /v2/models/{name}/generate`` and
``/generate_stream`` (Server-Sent Events), decoded into a :class:`TextRequest`.

The body is a JSON object: ``text_input`` (the prompt), and the sampling parameters either
in ``parameters`` or at the top level, as Triton's vLLM backend takes them: ``max_tokens``,
``temperature``, ``top_p``, ``top_k``, ``seed``, ``stop``, ``stop_token_ids``,
``ignore_eos``. An answer is
``{"model_name", "model_version", "text_output", "finish_reason"}``; ``text_output`` is the
generated text only (the prompt is not repeated). A stream sends one such event per piece
of text; an error mid-stream is one ``{"error": ...}`` event.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from gear_runtime.errors import InputError
from gear_runtime.serving.generation import Generation, ServedLlm, TextRequest
from gear_runtime.serving.openai_api import COMPLETION_MAX_TOKENS, completion_request, sse
from gear_runtime.serving.protocol import MODEL_VERSION

_SAMPLING = ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids",
             "ignore_eos")


def generate_request(doc: dict[str, Any], served: ServedLlm) -> TextRequest:
    """The body as a request of ``served``; InputError naming the field."""
    text = doc.get("text_input")
    if not isinstance(text, str) or not text:
        raise InputError(f'"text_input" must be a non-empty string, got {text!r:.80}')
    parameters = doc.get("parameters", {})
    if not isinstance(parameters, dict):
        raise InputError(f'"parameters" must be an object, got {parameters!r:.80}')
    fields: dict[str, Any] = {k: doc[k] for k in _SAMPLING if k in doc}
    fields.update((k, v) for k, v in parameters.items() if k in _SAMPLING)
    fields.setdefault("max_tokens", COMPLETION_MAX_TOKENS)
    return completion_request({**fields, "prompt": text}, served)


def answer(served: ServedLlm, text: str, generation: Generation) -> dict[str, Any]:
    return {"model_name": served.name, "model_version": MODEL_VERSION, "text_output": text,
            "finish_reason": generation.finish_reason}


async def events(served: ServedLlm, generation: Generation,
                 on_error: Any) -> AsyncIterator[bytes]:
    """``generate_stream``'s events: one per delta with text or the finish reason."""
    try:
        async for delta in generation:
            if delta.text or delta.finish_reason is not None:
                yield sse({"model_name": served.name, "model_version": MODEL_VERSION,
                           "text_output": delta.text, "finish_reason": delta.finish_reason})
    except Exception as exc:  # noqa: BLE001 - answered in the stream, counted by on_error
        yield sse(on_error(exc))
    finally:
        await generation.aclose()


__all__ = ["answer", "events", "generate_request"]
