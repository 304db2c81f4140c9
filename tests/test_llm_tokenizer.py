"""The text layer of the LLM engine: gear_runtime.llm.tokenizer over the example tokenizer
(gear_runtime.examples.tokenizer). Fast, no network; the comparison with transformers' own
apply_chat_template runs only where transformers is importable."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gear_runtime.errors import InputError
from gear_runtime.examples.tokenizer import MIN_VOCAB, SPECIAL_TOKENS, write_tokenizer
from gear_runtime.llm.tokenizer import StopStrings, Tokenizer

VOCAB = 512
FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
MIXED = "Hello, world! Le café très chaud, Straße, niño. 你好，世界。こんにちは 안녕 👍🏽 🇫🇷 👨‍👩‍👧"
FUZZ = settings(max_examples=200, deadline=None, derandomize=True)
CONVERSATION = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Où est le café? ☕"}]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tokenizer(tmp_path_factory.mktemp("tok") / "model", VOCAB)


@pytest.fixture(scope="module")
def tok(folder: Path) -> Tokenizer:
    return Tokenizer.from_folder(folder)


def _digests(directory: Path) -> dict[str, str]:
    return {n: hashlib.sha256((directory / n).read_bytes()).hexdigest() for n in FILES}


# -- the writer ----------------------------------------------------------------------------

def test_writer_is_deterministic_across_processes(folder: Path, tmp_path: Path) -> None:
    # another interpreter with another hash seed: nothing may hang on dict or set order; 4096
    # ids are more than the built-in text trains, so the filling merges are covered too
    code = ("import sys; from gear_runtime.examples.tokenizer import write_tokenizer; "
            f"write_tokenizer(sys.argv[1], {VOCAB}); write_tokenizer(sys.argv[2], 4096)")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    there = [tmp_path / "there", tmp_path / "there_4096"]
    subprocess.run([sys.executable, "-c", code, *map(str, there)], check=True, env=env)
    assert _digests(there[0]) == _digests(folder)
    assert _digests(there[1]) == _digests(write_tokenizer(tmp_path / "here_4096", 4096))


@pytest.mark.parametrize("vocab", [MIN_VOCAB, VOCAB, 32000])
def test_writer_gives_exactly_vocab_ids(tmp_path: Path, vocab: int) -> None:
    from tokenizers import Tokenizer as Backend

    write_tokenizer(tmp_path, vocab)
    backend = Backend.from_file(str(tmp_path / "tokenizer.json"))
    assert backend.get_vocab_size() == vocab
    assert sorted(backend.get_vocab().values()) == list(range(vocab))  # no holes
    assert [backend.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2]
    assert Tokenizer.from_folder(tmp_path).vocab_size == vocab


def test_writer_refuses_too_small_vocab_and_unknown_eos(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=str(MIN_VOCAB)):
        write_tokenizer(tmp_path, MIN_VOCAB - 1)
    with pytest.raises(ValueError, match="eos_token"):
        write_tokenizer(tmp_path, VOCAB, eos_token="</s>")


def test_writer_config_is_what_transformers_reads(folder: Path) -> None:
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["bos_token"] is None
    assert config["eos_token"] == config["pad_token"] == "<|endoftext|>"
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert "<|im_start|>" in config["chat_template"]
    assert {v["content"] for v in config["added_tokens_decoder"].values()} == set(SPECIAL_TOKENS)


def test_eos_token_as_given(tmp_path: Path) -> None:
    tok = Tokenizer.from_folder(write_tokenizer(tmp_path, VOCAB, eos_token="<|im_end|>"))
    assert tok.eos_token_ids == (2,)


def test_genai_folder_has_a_matching_tokenizer(tmp_path: Path) -> None:
    from gear_runtime.examples import gqa_lm
    from gear_runtime.llm.folder import read_folder

    folder = gqa_lm.write_genai_folder(tmp_path, gqa_lm.SMALL)
    model, tok = read_folder(folder), Tokenizer.from_folder(folder)
    assert tok.vocab_size == model.vocab_size
    assert tok.eos_token_ids == model.eos_token_ids == (0,)


# -- encode / decode -----------------------------------------------------------------------

def test_round_trip_of_mixed_text(tok: Tokenizer) -> None:
    ids = tok.encode(MIXED)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == MIXED
    # some ids hold part of a character: the byte-level BPE splits multi-byte characters
    assert any("\ufffd" in tok.decode([i]) for i in ids)


@given(st.text(max_size=60))
@FUZZ
def test_round_trip_of_any_text(tok: Tokenizer, text: str) -> None:
    assert tok.decode(tok.encode(text), skip_special_tokens=False) == text


def test_special_tokens(tok: Tokenizer) -> None:
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == tok.token_ids("<|im_start|>") == 1
    assert ids[-1] == tok.token_ids("<|im_end|>") == 2
    assert tok.decode(ids) == "user\nhi"
    assert tok.decode(ids, skip_special_tokens=False) == "<|im_start|>user\nhi<|im_end|>"
    assert tok.token_ids("no such token here") is None
    assert tok.eos_token_ids == (0,)
    assert tok.encode("hi", add_special_tokens=True) == tok.encode("hi", False)  # no BOS


@pytest.mark.parametrize("ids", [[-1], [1.5], "abc", [True], [2**32]])
def test_decode_refuses_what_is_not_ids(tok: Tokenizer, ids: object) -> None:
    with pytest.raises(InputError, match="token id"):
        tok.decode(ids)  # type: ignore[arg-type]


# -- the detokenizer -----------------------------------------------------------------------

def _stream(tok: Tokenizer, ids: list[int], skip: bool = True) -> list[str]:
    detok = tok.detokenizer(skip_special_tokens=skip)
    return [detok.push(i) for i in ids] + [detok.flush()]


def test_detokenizer_holds_back_a_split_character(tok: Tokenizer) -> None:
    ids = tok.encode("a👍🏽b")
    assert len(ids) > 3  # the emoji takes several ids, the first ones incomplete
    pieces = _stream(tok, ids)
    assert "".join(pieces) == "a👍🏽b"
    assert not any("\ufffd" in p for p in pieces)
    assert "" in pieces[1:-2]  # held while the character was incomplete


@given(st.text(max_size=40))
@FUZZ
def test_detokenizer_never_emits_a_partial_character(tok: Tokenizer, text: str) -> None:
    pieces = _stream(tok, tok.encode(text))
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces if "\ufffd" not in text)


@given(st.lists(st.integers(0, VOCAB - 1), max_size=30), st.booleans())
@FUZZ
def test_detokenizer_equals_decode_for_any_ids(tok: Tokenizer, ids: list[int],
                                               skip: bool) -> None:
    # random ids split characters anywhere and make invalid UTF-8: the pieces still add up
    # to decode(), and only flush() may end in an incomplete character
    pieces = _stream(tok, ids, skip)
    assert "".join(pieces) == tok.decode(ids, skip_special_tokens=skip)
    assert not any(p.endswith("\ufffd") for p in pieces[:-1])


@pytest.fixture(scope="module")
def sentencepiece_like(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    """A Metaspace tokenizer (Llama's, T5's): its decoder drops the first token's space."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, pre_tokenizers, trainers

    backend = Backend(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer, backend.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    backend.train_from_iterator(
        ["Hello world, hello there. The world is round. Où est le café?"],
        trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>", "</s>"],
                            show_progress=False))
    folder = tmp_path_factory.mktemp("metaspace")
    backend.save(str(folder / "tokenizer.json"))
    return Tokenizer.from_folder(folder)


def test_detokenizer_keeps_spaces_of_a_sentencepiece_decoder(
        sentencepiece_like: Tokenizer) -> None:
    # each piece is decoded after the token before it, so its leading space survives
    ids = sentencepiece_like.encode("Hello world, the café is round")
    pieces = _stream(sentencepiece_like, ids)
    assert pieces[:3] == ["Hello", " world,", " the"]
    assert "".join(pieces) == "Hello world, the café is round"


@given(st.lists(st.integers(0, 66), max_size=12), st.booleans())
@FUZZ
def test_detokenizer_equals_decode_for_sentencepiece_ids(
        sentencepiece_like: Tokenizer, ids: list[int], skip: bool) -> None:
    pieces = _stream(sentencepiece_like, ids, skip)
    assert "".join(pieces) == sentencepiece_like.decode(ids, skip_special_tokens=skip)


def test_detokenizer_ignores_the_prompt_for_the_text(tok: Tokenizer) -> None:
    prompt, generated = tok.encode("The answer is"), tok.encode(" forty-two ☕")
    detok = tok.detokenizer(prompt)
    text = "".join(detok.push(i) for i in generated) + detok.flush()
    assert text == tok.decode(generated) == " forty-two ☕"
    with pytest.raises(InputError, match="token id"):
        detok.push(-3)


# -- stop strings --------------------------------------------------------------------------

def test_stop_string_split_across_pushes() -> None:
    stops = StopStrings(["STOP"])
    assert stops.push("hello ST") == ("hello ", False)
    assert stops.push("O") == ("", False)
    assert stops.push("P and more") == ("", True)
    assert stops.push("later") == ("", True)
    assert stops.flush() == ""


def test_stop_at_the_very_start() -> None:
    stops = StopStrings(["\n\n", "###"])
    assert stops.push("###tail") == ("", True)


def test_overlapping_stop_strings() -> None:
    stops = StopStrings(["abc", "ab"])
    assert stops.push("xa") == ("x", False)
    assert stops.push("bc") == ("", True)  # "ab" completes first
    stops = StopStrings(["abcd", "bc"])
    assert stops.push("zabcd") == ("za", True)  # "bc" completes before "abcd" would
    stops = StopStrings(["ab", "b"])
    assert stops.push("zab") == ("z", True)  # same end: the longer one, starting first


def test_no_stop_flushes_the_held_tail() -> None:
    stops = StopStrings(["<end>"])
    assert stops.push("text <e") == ("text ", False)
    assert stops.push("n") == ("", False)
    assert stops.push("x <") == ("<enx ", False)
    assert stops.flush() == "<"
    assert StopStrings([]).push("any") == ("any", False)
    assert StopStrings("ab").stops == ("ab",)  # a bare string is one stop string


@pytest.mark.parametrize("stops", [[""], ["ok", ""], [None]])
def test_stop_strings_refuse_empty_or_non_strings(stops: list) -> None:
    with pytest.raises(InputError, match="stop"):
        StopStrings(stops)


def _stopped(text: str, stops: list[str]) -> tuple[str, bool]:
    """The reference: the whole text at once, cut at the stop string that ends first."""
    found = [(text.find(s) + len(s), text.find(s)) for s in stops if s in text]
    return (text[:min(found)[1]], True) if found else (text, False)


@given(st.text("abc", max_size=20), st.lists(st.text("abc", min_size=1, max_size=4),
                                             max_size=3), st.lists(st.integers(0, 20)))
@FUZZ
def test_stop_strings_do_not_depend_on_chunking(text: str, stops: list[str],
                                                cuts: list[int]) -> None:
    matcher, out, matched = StopStrings(stops), [], False
    edges = [0, *sorted(min(c, len(text)) for c in cuts), len(text)]
    for start, stop in itertools.pairwise(edges):
        piece, matched = matcher.push(text[start:stop])
        out.append(piece)
    assert ("".join(out) + matcher.flush(), matched) == _stopped(text, stops)


# -- the chat template ---------------------------------------------------------------------

def test_chat_template_renders_chatml(tok: Tokenizer) -> None:
    assert tok.has_chat_template
    base = ("<|im_start|>system\nYou are terse.<|im_end|>\n"
            "<|im_start|>user\nOù est le café? ☕<|im_end|>\n")
    assert tok.apply_chat_template(CONVERSATION, add_generation_prompt=False) == base
    assert tok.apply_chat_template(CONVERSATION) == base + "<|im_start|>assistant\n"


def test_raise_exception_in_the_template_is_an_input_error(tok: Tokenizer) -> None:
    with pytest.raises(InputError, match="Unknown role: tool"):
        tok.apply_chat_template([{"role": "tool", "content": "42"}])


@pytest.mark.parametrize("messages", [[], "hi", [{"role": "user"}],
                                      [{"role": "user", "content": ["parts"]}], ["hi"]])
def test_malformed_messages_are_input_errors(tok: Tokenizer, messages: object) -> None:
    with pytest.raises(InputError, match="messages"):
        tok.apply_chat_template(messages)  # type: ignore[arg-type]


def _with_config(folder: Path, target: Path, **changes: object) -> Path:
    target.mkdir(exist_ok=True)
    (target / "tokenizer.json").write_bytes((folder / "tokenizer.json").read_bytes())
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    config.update(changes)
    (target / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return target


def test_template_environment_is_transformers(folder: Path, tmp_path: Path) -> None:
    # tojson keeps non-ASCII and does not escape HTML; loopcontrols; trim / lstrip blocks;
    # the special tokens as variables; strftime_now exists
    template = ("{% for m in messages %}\n  {% if loop.index > 1 %}{% break %}{% endif %}\n"
                "{{ m | tojson }}|{{ eos_token }}|{{ bos_token is defined }}\n"
                "{% endfor %}{{ strftime_now('%Y') | length }}")
    tok = Tokenizer.from_folder(_with_config(folder, tmp_path, chat_template=template))
    messages = [{"role": "user", "content": "<b>é</b> & '"}, {"role": "x", "content": "y"}]
    assert tok.apply_chat_template(messages) == (
        '{"role": "user", "content": "<b>é</b> & \'"}|<|endoftext|>|False\n4')


def test_folder_without_template(folder: Path, tmp_path: Path) -> None:
    tok = Tokenizer.from_folder(_with_config(folder, tmp_path, chat_template=None))
    assert not tok.has_chat_template
    with pytest.raises(InputError, match="no chat_template"):
        tok.apply_chat_template(CONVERSATION)
    bad = Tokenizer.from_folder(_with_config(folder, tmp_path, chat_template="{% if %}"))
    with pytest.raises(InputError, match="not a valid jinja2 template"):
        bad.apply_chat_template(CONVERSATION)


def test_chat_template_file_comes_first(folder: Path, tmp_path: Path) -> None:
    target = _with_config(folder, tmp_path)
    (target / "chat_template.jinja").write_text("{{ messages[0]['content'] }}!")
    assert Tokenizer.from_folder(target).apply_chat_template(CONVERSATION) == "You are terse.!"


# -- missing and broken files --------------------------------------------------------------

def test_missing_tokenizer_json_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=str(tmp_path / "tokenizer.json").replace("\\", "\\\\")):
        Tokenizer.from_folder(tmp_path)


def test_broken_files_name_the_file(folder: Path, tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(InputError, match="tokenizer.json"):
        Tokenizer.from_folder(tmp_path)
    target = _with_config(folder, tmp_path / "cfg")
    (target / "tokenizer_config.json").write_text("[1, 2")
    with pytest.raises(InputError, match="tokenizer_config.json"):
        Tokenizer.from_folder(target)
    (target / "tokenizer_config.json").unlink()  # optional: a folder loads without it
    assert Tokenizer.from_folder(target).has_chat_template is False


# -- transformers' own, where it is installed ----------------------------------------------

def test_same_as_transformers(folder: Path, tok: Tokenizer) -> None:
    transformers = pytest.importorskip("transformers")
    theirs = transformers.AutoTokenizer.from_pretrained(str(folder))
    for generation in (True, False):
        assert tok.apply_chat_template(CONVERSATION, generation) == theirs.apply_chat_template(
            CONVERSATION, tokenize=False, add_generation_prompt=generation)
    assert tok.encode(MIXED) == theirs.encode(MIXED)
    assert tok.decode(tok.encode(MIXED)) == theirs.decode(theirs.encode(MIXED),
                                                          skip_special_tokens=True)
    assert theirs.eos_token_id == tok.eos_token_ids[0]
    assert len(theirs) == tok.vocab_size
