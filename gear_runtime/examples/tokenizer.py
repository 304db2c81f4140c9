"""A small Hugging Face tokenizer for the example models, written from code (no download).

:func:`write_tokenizer` writes what a Hugging Face checkpoint carries beside its weights:
``tokenizer.json`` (a byte-level BPE, GPT-2 / Qwen style, built with ``tokenizers``),
``tokenizer_config.json`` (the special tokens and a Qwen-style ChatML ``chat_template``) and
``special_tokens_map.json``. ``transformers.AutoTokenizer.from_pretrained(folder)`` loads it
as-is, and so does :class:`gear_runtime.llm.tokenizer.Tokenizer`.

The BPE is trained on a built-in text in several scripts (accented Latin, Cyrillic, Greek,
CJK, emoji), so multi-byte characters are split across tokens as in a real vocabulary. A
vocabulary larger than that text supports is filled with further merges of existing tokens
(see :func:`_fill_merges`), so every id below ``vocab_size`` is a real BPE token.
"""

from __future__ import annotations

import json
from pathlib import Path

SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
#: 256 byte tokens + the special tokens
MIN_VOCAB = 256 + len(SPECIAL_TOKENS)

#: ChatML as Qwen writes it (without Qwen's default system message), for system / user /
#: assistant messages; any other role is refused through ``raise_exception``.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('Unknown role: ' + message['role']) }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

CORPUS = """\
The quick brown fox jumps over the lazy dog. A model compiled at discrete shapes runs the
gear that covers its input: the prompt is padded to the next gear, and every decode step of
many sequences runs in one batch. Hello, world! How are you today? I am fine, thank you.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2024 3.14159 -7 1e-5 ; symbols: #include <stdio.h>
def main(argv: list[str]) -> int:\n    return len(argv)  # {"key": [1, 2, 3]} 'quoted'
Le café est très bon, mais l'été à Paris est chaud. Où est la bibliothèque ? Ça va très bien.
Der Bär läuft über die Straße; schöne Grüße aus München. Fußgänger, Äpfel, Öl, Übung.
El niño comió piña en la montaña; ¿dónde está el baño? ¡Qué día más bonito! Año, señor.
Ação, coração, não, pão e informação. Smörgåsbord, fjärd, Ærø, Łódź, Dvořák, Škoda, İstanbul.
Привет, мир! Как дела? Москва — столица России. Спасибо, до свидания.
Καλημέρα κόσμε. Η γλώσσα είναι ελληνική. Ευχαριστώ πολύ.
你好，世界！今天天气很好。我们一起去吃饭吧。中文分词是一个有趣的问题。模型在离散形状上编译。
こんにちは、世界。日本語のテキストです。東京は大きな都市です。ありがとうございます。
안녕하세요, 세계! 한국어 문장입니다. 감사합니다. 서울은 아름다운 도시입니다.
مرحبا بالعالم. هذه جملة عربية. שלום עולם. नमस्ते दुनिया। สวัสดีชาวโลก
Emoji: 😀 😃 😄 😁 😂 🤣 ❤️ 👍 👍🏽 🎉 🚀 🌍 🐍 🦀 👨‍👩‍👧‍👦 🇫🇷 🇯🇵 ✨ ☕ 🍕 — the end.
"""


def write_tokenizer(directory: str | Path, vocab_size: int, *,
                    eos_token: str = "<|endoftext|>", model_max_length: int = 32768) -> Path:
    """``tokenizer.json``, ``tokenizer_config.json`` and ``special_tokens_map.json`` in
    ``directory`` (created if missing); returns ``directory``.

    A byte-level BPE of exactly ``vocab_size`` ids (ValueError below :data:`MIN_VOCAB`): id 0
    ``<|endoftext|>`` (the pad and, by default, the end of sequence: the example models'
    ``genai_config.json`` says ``eos_token_id`` 0), 1 ``<|im_start|>``, 2 ``<|im_end|>``
    (special tokens), then the 256 bytes, then merges. ``eos_token`` must be one of the
    special tokens (ValueError otherwise). ``tokenizer_config.json`` has a ChatML
    ``chat_template``, ``bos_token`` null, ``tokenizer_class`` ``PreTrainedTokenizerFast``.
    Deterministic: the same arguments write byte-identical files.
    """
    if not isinstance(vocab_size, int) or vocab_size < MIN_VOCAB:
        raise ValueError(f"vocab_size {vocab_size!r}: expected an int >= {MIN_VOCAB} "
                         f"(256 bytes + {len(SPECIAL_TOKENS)} special tokens)")
    if eos_token not in SPECIAL_TOKENS:
        raise ValueError(f"eos_token {eos_token!r}: expected one of {SPECIAL_TOKENS}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tokenizer.json").write_text(tokenizer_json(vocab_size), encoding="utf-8")
    specials = {"eos_token": eos_token, "pad_token": SPECIAL_TOKENS[0],
                "additional_special_tokens": list(SPECIAL_TOKENS[1:])}
    _write_json(directory / "tokenizer_config.json",
                _tokenizer_config(specials, model_max_length))
    _write_json(directory / "special_tokens_map.json", specials)
    return directory


def tokenizer_json(vocab_size: int) -> str:
    """The text of ``tokenizer.json`` for ``vocab_size`` ids (see :func:`write_tokenizer`)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    # GPT-2's byte-level scheme: no normalizer, so decode(encode(text)) == text for any text
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(CORPUS.splitlines(keepends=True), trainer)
    data = json.loads(tokenizer.to_str())
    _fill_merges(data["model"], vocab_size)
    full = Tokenizer.from_str(json.dumps(data))
    if full.get_vocab_size() != vocab_size:  # a bug here, never the caller's
        raise AssertionError(f"built {full.get_vocab_size()} ids, wanted {vocab_size}")
    return full.to_str(pretty=True)


def _fill_merges(model: dict, vocab_size: int) -> None:
    """Add merges ``a b -> ab`` of tokens already in ``model['vocab']`` (in id order) until it
    holds ``vocab_size`` ids. Real merges rather than added tokens: an added token is matched
    in raw text before the BPE runs, and tens of thousands of them would slow every load."""
    vocab: dict[str, int] = model["vocab"]
    merges: list = model["merges"]
    base = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])
            if token not in SPECIAL_TOKENS]
    for first in base:
        for second in base:
            if len(vocab) >= vocab_size:
                return
            joined = first + second
            if joined not in vocab:
                vocab[joined] = len(vocab)
                merges.append([first, second])


def _tokenizer_config(specials: dict, model_max_length: int) -> dict:
    """``tokenizer_config.json`` as ``transformers`` reads it (Qwen2's, minus its class)."""
    decoder = {str(i): {"content": token, "lstrip": False, "normalized": False,
                        "rstrip": False, "single_word": False, "special": True}
               for i, token in enumerate(SPECIAL_TOKENS)}
    return {"add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": decoder,
            **specials, "bos_token": None, "chat_template": CHAT_TEMPLATE,
            "clean_up_tokenization_spaces": False, "errors": "replace",
            "model_max_length": model_max_length, "split_special_tokens": False,
            "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": None}


def _write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
