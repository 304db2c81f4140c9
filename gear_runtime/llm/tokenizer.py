"""Text in and out of a model folder: the Hugging Face tokenizer beside the weights.

:class:`Tokenizer` reads ``tokenizer.json`` (Hugging Face ``tokenizers``, the format every
"fast" tokenizer saves) and, when present, ``tokenizer_config.json`` (special tokens, chat
template) and ``chat_template.jinja``. ``apply_chat_template`` renders a conversation exactly
as ``transformers``' ``apply_chat_template(..., tokenize=False)`` does, without
``transformers``: the same sandboxed jinja2 environment, filters and globals
(``transformers/utils/chat_template_utils.py``).

:class:`Detokenizer` turns a sequence's generated ids into text as they come (vLLM's prefix /
read offsets), never emitting half a character; :class:`StopStrings` cuts a text stream at
the first stop string, holding back what could still become one (OpenAI's ``stop``).
"""

from __future__ import annotations

import json
import operator
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

from gear_runtime.errors import InputError
from gear_runtime.llm.folder import read_json_object

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"
#: transformers >= 4.43 saves a single chat template here, ahead of the config's
CHAT_TEMPLATE_FILE = "chat_template.jinja"
#: the named special tokens transformers passes to a chat template (its
#: SPECIAL_TOKENS_ATTRIBUTES; the ones a folder sets)
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                       "cls_token", "mask_token")
REPLACEMENT_CHAR = "\ufffd"


class Tokenizer:
    """A folder's tokenizer (see the module doc). Thread-safe: nothing changes after load."""

    def __init__(self, backend: Any, config: Mapping[str, Any], path: Path,
                 chat_template: str | None = None) -> None:
        """``backend``: a ``tokenizers.Tokenizer``; ``config``: ``tokenizer_config.json``'s
        content (with ``special_tokens_map.json``'s tokens where the config has none);
        ``path``: the folder, named in errors. Use :meth:`from_folder`."""
        self._backend = backend
        self._config = dict(config)
        self.path = path
        self.chat_template = chat_template
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        self.special_tokens: dict[str, str] = _special_tokens(self._config)
        eos = self.special_tokens.get("eos_token")
        eos_id = None if eos is None else backend.token_to_id(eos)
        self.eos_token_ids: tuple[int, ...] = () if eos_id is None else (eos_id,)

    @classmethod
    def from_folder(cls, path: str | Path) -> Tokenizer:
        """The tokenizer of the folder at ``path``: ``tokenizer.json`` required,
        ``tokenizer_config.json`` / ``special_tokens_map.json`` / ``chat_template.jinja``
        where present. InputError naming the file that is missing or unreadable."""
        from tokenizers import Tokenizer as Backend

        folder = Path(path)
        file = folder / TOKENIZER_FILE
        if not file.is_file():
            raise InputError(f"{file}: no such file (a Hugging Face tokenizer folder holds "
                             f"{TOKENIZER_FILE}, the 'fast' tokenizer's one file)")
        try:
            backend = Backend.from_file(str(file))
        except Exception as exc:  # tokenizers raises a bare Exception on a bad file
            raise InputError(f"{file}: not a readable {TOKENIZER_FILE} ({exc})") from None
        config = read_json_object(folder / CONFIG_FILE)
        for name, value in read_json_object(folder / SPECIAL_TOKENS_MAP_FILE).items():
            config.setdefault(name, value)  # the legacy file only fills what the config lacks
        return cls(backend, config, folder, _chat_template(folder, config))

    @property
    def has_chat_template(self) -> bool:
        """Whether :meth:`apply_chat_template` can render (the folder has a template)."""
        return self.chat_template is not None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """``text``'s ids; ``add_special_tokens``: with what the tokenizer's post-processor
        adds (a BOS for Llama; nothing for byte-level BPEs such as Qwen's or GPT-2's)."""
        if not isinstance(text, str):
            raise InputError(f"text: expected a str, got {type(text).__name__}")
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """The text of ``ids`` (ints >= 0; an id the tokenizer does not know decodes to
        nothing, as for the padding rows of a model's vocabulary beyond the tokenizer's)."""
        return self._backend.decode(_checked_ids(ids), skip_special_tokens=skip_special_tokens)

    def token_ids(self, text: str) -> int | None:
        """The id of the one token whose text is ``text`` (``"<|im_end|>"``), else None."""
        return self._backend.token_to_id(text) if isinstance(text, str) else None

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """``messages`` (a non-empty list of ``{"role": str, "content": str, ...}``) rendered
        by the folder's chat template as transformers renders it with ``tokenize=False``.
        InputError when the folder has no template, a message is malformed, or the template
        refuses the conversation (its ``raise_exception``)."""
        if self.chat_template is None:
            raise InputError(f"{self.path}: the tokenizer has no chat_template (neither "
                             f"{CONFIG_FILE} nor {CHAT_TEMPLATE_FILE} holds one); send a "
                             "prompt instead of messages")
        import jinja2

        chat = _checked_messages(messages)
        try:
            return self._compiled_template.render(
                messages=chat, tools=None, documents=None,
                add_generation_prompt=bool(add_generation_prompt), **self.special_tokens)
        except jinja2.TemplateError as exc:
            raise InputError(f"messages: the chat template of {self.path} refused them: "
                             f"{exc}") from None

    @cached_property
    def _compiled_template(self) -> Any:
        """The template compiled once, on first use (a folder serving plain prompts never
        pays for it, nor fails on a template it does not use)."""
        import jinja2

        try:
            return compile_chat_template(self.chat_template or "")
        except jinja2.TemplateError as exc:
            raise InputError(f"{self.path}: chat_template is not a valid jinja2 template "
                             f"({exc})") from None

    def detokenizer(self, prompt_ids: Sequence[int] = (), *,
                    skip_special_tokens: bool = True) -> Detokenizer:
        """A :class:`Detokenizer` for one sequence's generated ids. ``prompt_ids`` does not
        change the text (it is that of the generated ids alone, what :meth:`decode` returns:
        an OpenAI completion's text); it is checked and accepted so that a call site may
        pass it, as vLLM's does."""
        _checked_ids(prompt_ids)
        return Detokenizer(self, skip_special_tokens=skip_special_tokens)


class Detokenizer:
    """Incremental decoding of one sequence's generated ids (vLLM's prefix/read offsets).

    ``push(id)`` returns the text that became final with that token, never a partial
    multi-byte character (text ending in U+FFFD is held back until a later token completes
    it), and the concatenation of every ``push()`` result and ``flush()`` equals
    ``tokenizer.decode(all generated ids)`` (exactly for byte-level BPEs; for others, as
    exactly as decoding from the previous token's start allows). Not thread-safe: one
    sequence, one caller.
    """

    def __init__(self, tokenizer: Tokenizer, *, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        # decode from _prefix (one emitted token of context: a SentencePiece decoder drops
        # the space of a window's first token) and emit what lies past the text of
        # ids[_prefix:_read], which is already out
        self._prefix = 0
        self._read = 0

    def push(self, token_id: int) -> str:
        """Add one generated id; the text it made final ("" while a character is
        incomplete, or for a skipped special token)."""
        self._ids.append(_checked_id(token_id, "token_id"))
        done = self._decode(self._prefix, self._read)
        text = self._decode(self._prefix, len(self._ids))
        if len(text) <= len(done) or text.endswith(REPLACEMENT_CHAR):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return text[len(done):]

    def flush(self) -> str:
        """What is held back at the end of the sequence (may hold U+FFFD where the ids
        truly end inside a character); the detokenizer is then empty of pending text."""
        done = self._decode(self._prefix, self._read)
        text = self._decode(self._prefix, len(self._ids))
        self._prefix = self._read = len(self._ids)
        return text[len(done):]

    def _decode(self, start: int, stop: int) -> str:
        if start == stop:
            return ""
        return self._tokenizer._backend.decode(self._ids[start:stop],
                                               skip_special_tokens=self._skip)


class StopStrings:
    """Stop strings over a text stream (OpenAI's ``stop``).

    ``push(text)`` returns ``(text safe to emit now, matched)``: it holds back the tail that
    could still be the start of a stop string; when a stop string completes, it returns the
    text before it and True (the stop string itself is not emitted, as OpenAI and vLLM do),
    and every later push returns ``("", True)``. Of several stop strings, the one that
    completes first wins (at the same end, the one starting first), whatever the chunking.
    ``flush()`` returns the held-back tail at the end of a stream that did not stop. With no
    stop strings, text passes straight through.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        """``stops``: the stop strings (a bare str is one stop string). InputError on an
        empty string or a non-str."""
        stops = [stops] if isinstance(stops, str) else list(stops)
        for stop in stops:
            if not isinstance(stop, str) or not stop:
                raise InputError(f"stop: {stop!r} is not a stop string (expected non-empty "
                                 "strings)")
        self.stops: tuple[str, ...] = tuple(dict.fromkeys(stops))
        self.matched = False
        self._held = ""

    def push(self, text: str) -> tuple[str, bool]:
        """Add ``text``; what is safe to emit now, and whether a stop string completed."""
        if self.matched:
            return "", True
        if not isinstance(text, str):
            raise InputError(f"text: expected a str, got {type(text).__name__}")
        buffer = self._held + text
        # (end, start) of each stop string's first occurrence: the earliest end completed
        # first; at one end, the longer string (earlier start) wins
        found = [(at + len(s), at) for s in self.stops if (at := buffer.find(s)) >= 0]
        if found:
            self.matched, self._held = True, ""
            return buffer[:min(found)[1]], True
        keep = self._pending_length(buffer)
        self._held = buffer[len(buffer) - keep:]
        return buffer[:len(buffer) - keep], False

    def flush(self) -> str:
        """The held-back tail (the stream ended without a stop string); "" after a match."""
        held, self._held = self._held, ""
        return held

    def _pending_length(self, buffer: str) -> int:
        """The length of ``buffer``'s longest tail that is a proper prefix of a stop string
        (it may still grow into one)."""
        longest = max((len(s) for s in self.stops), default=1) - 1
        for size in range(min(longest, len(buffer)), 0, -1):
            tail = buffer[-size:]
            if any(s.startswith(tail) for s in self.stops):
                return size
        return 0


def compile_chat_template(source: str) -> Any:
    """``source`` compiled as transformers compiles a chat template
    (``_compile_jinja_template``): an immutable sandbox, ``trim_blocks`` / ``lstrip_blocks``,
    the ``loopcontrols`` extension, its ``tojson`` filter (no HTML escaping, non-ASCII kept)
    and its globals ``raise_exception`` and ``strftime_now``. (transformers' ``{% generation
    %}`` tag, for assistant masks in training, is not supported.)"""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # transformers' override: jinja's own tojson escapes HTML characters (<, >, &, ')
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    import jinja2

    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _chat_template(folder: Path, config: Mapping[str, Any]) -> str | None:
    """The folder's default chat template: ``chat_template.jinja`` first (as transformers
    loads it), else the config's ``chat_template`` (a string, or a list of ``{"name",
    "template"}`` of which the one named "default")."""
    file = folder / CHAT_TEMPLATE_FILE
    if file.is_file():
        try:
            return file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"{file}: not readable ({exc})") from None
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if template is not None and not isinstance(template, str):
        raise InputError(f"{folder / CONFIG_FILE}: chat_template {template!r}: expected a "
                         "string or a list of {name, template} with a 'default'")
    return template


def _special_tokens(config: Mapping[str, Any]) -> dict[str, str]:
    """The named special tokens the config sets, as strings (a saved AddedToken is a dict
    with its text under "content")."""
    tokens = {}
    for name in SPECIAL_TOKEN_NAMES:
        value = config.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            tokens[name] = value
    return tokens


def _checked_id(value: Any, name: str) -> int:
    """``value`` as a token id (an int, numpy's included, in [0, 2**32)); else InputError."""
    try:  # operator.index: ints and numpy integers, never floats or strings
        index = -1 if isinstance(value, bool) else operator.index(value)
    except TypeError:
        index = -1
    if not 0 <= index < 2**32:  # tokenizers holds ids as u32
        raise InputError(f"{name}: {value!r:.40} is not a token id (expected an int >= 0)")
    return index


def _checked_ids(ids: Sequence[int]) -> list[int]:
    """``ids`` (a sequence or numpy array of token ids) as a list of ints; else InputError."""
    if isinstance(ids, (str, bytes, Mapping)):
        raise InputError(f"ids: expected a sequence of token ids, got {type(ids).__name__}")
    try:
        items = list(ids)
    except TypeError:
        raise InputError(f"ids: expected a sequence of token ids, got "
                         f"{type(ids).__name__}") from None
    return [_checked_id(i, "ids") for i in items]


def _checked_messages(messages: Any) -> list[dict[str, Any]]:
    """``messages`` as the template sees them: each a new dict, its None values dropped (as
    transformers drops them); InputError naming the first malformed message."""
    if not isinstance(messages, list) or not messages:
        raise InputError(f"messages: expected a non-empty list of {{'role', 'content'}} "
                         f"dicts, got {type(messages).__name__} {messages!r:.80}")
    chat = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InputError(f"messages[{i}]: expected a dict, got {type(message).__name__}")
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                raise InputError(f"messages[{i}].{key}: {message.get(key)!r:.80}: expected a "
                                 "string")
        chat.append({k: v for k, v in message.items() if v is not None})
    return chat
