"""``gear-runtime completion bash|zsh|fish`` (#54): each script completes in the real shell
(bash always; zsh and fish where installed), and it is generated from the parser, so every
command and flag of :func:`build_parser` is in it and a command added to the parser
completes without editing the generator."""

from __future__ import annotations

import argparse
import shutil
import subprocess
from pathlib import Path

import pytest
from cli_support import run_cli

from gear_runtime.cli import app as cli
from gear_runtime.cli import completion

# The completion function that ``complete -p gear-runtime`` registered, called with the
# command line in COMP_WORDS (the last word is the one under the cursor).
BASH_COMPLETE = """source "$0"
spec=($(complete -p gear-runtime))
[[ ${spec[1]} == -F ]] || { echo "not registered: ${spec[*]}" >&2; exit 3; }
COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1))
"${spec[2]}"
printf '%s\\n' "${COMPREPLY[@]}"
"""
# zsh's completion builtins only run inside a completion widget: these stand-ins print what
# the script hands them (the NAME:HELP menu, the words, the file kind).
ZSH_STUBS = """compdef() { : }
_describe() { local n=${@[-1]}; print -rl -- "${(@P)n}" }
compadd() { shift; print -rl -- "$@" }
_files() { print -r -- "_files $*" }
_message() { : }
"""


def _write(tmp_path: Path, shell: str, parser: argparse.ArgumentParser | None = None) -> Path:
    path = tmp_path / f"gear-runtime.{shell}"
    path.write_text(completion.script(shell, parser or cli.build_parser()), encoding="utf-8")
    return path


def bash_complete(script: Path, *words: str, cwd: Path | None = None) -> list[str]:
    """What bash offers for ``gear-runtime WORDS`` with the cursor at the end of the last."""
    done = subprocess.run(["bash", "--norc", "--noprofile", "-c", BASH_COMPLETE, str(script),
                           "gear-runtime", *words], capture_output=True, text=True, cwd=cwd,
                          timeout=30)
    assert done.returncode == 0 and not done.stderr, done.stderr
    return [w for w in done.stdout.splitlines() if w]


@pytest.fixture(scope="module")
def bash_script(tmp_path_factory) -> Path:
    return _write(tmp_path_factory.mktemp("completion"), "bash")


def test_the_command_prints_the_script_of_the_parser(capsys) -> None:
    for shell in completion.SHELLS:
        code, out, err = run_cli(capsys, "completion", shell)
        assert code == 0 and not err
        assert out == completion.script(shell, cli.build_parser())


# ---- bash, in a real bash -------------------------------------------------------------------
def test_bash_completes_subcommands(bash_script: Path) -> None:
    assert bash_complete(bash_script, "se") == ["serve"]
    assert bash_complete(bash_script, "llm", "b") == ["build"]  # nested
    assert bash_complete(bash_script, "-v", "ch") == ["check-padding"]  # after a root flag


def test_bash_completes_the_flags_of_the_command_typed(bash_script: Path) -> None:
    flags = bash_complete(bash_script, "serve", "--max-")
    assert "--max-sequences" in flags and all(f.startswith("--max-") for f in flags)
    assert bash_complete(bash_script, "llm", "build", "--max-") == ["--max-sequences",
                                                                    "--max-length"]
    assert bash_complete(bash_script, "serve", "--worker-f") == []  # hidden: --worker-fd


def test_bash_completes_choices_files_and_folders(bash_script: Path, tmp_path: Path) -> None:
    (tmp_path / "a.gear.onnx").touch()
    (tmp_path / "a folder").mkdir()
    assert sorted(bash_complete(bash_script, "inspect", "", cwd=tmp_path)) == [
        "a folder", "a.gear.onnx"]
    assert bash_complete(bash_script, "run", "x", "--json", "a.", cwd=tmp_path) == [
        "a.gear.onnx"]
    assert bash_complete(bash_script, "llm", "build", "x", "-o", "", cwd=tmp_path) == [
        "a folder"]
    assert bash_complete(bash_script, "compile", "--external-data", "") == ["auto", "yes", "no"]
    assert bash_complete(bash_script, "completion", "") == list(completion.SHELLS)
    assert bash_complete(bash_script, "serve", "--port", "", cwd=tmp_path) == []  # a number


# ---- generated, not written: no drift -------------------------------------------------------
def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Every subcommand of ``parser`` (nested too) by name, read from argparse directly."""
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found[name] = child
                found.update(_commands(child))
    return found


@pytest.mark.parametrize("shell", completion.SHELLS)
def test_every_command_and_flag_of_the_parser_is_in_the_script(shell: str) -> None:
    parser = cli.build_parser()
    text = completion.script(shell, parser)
    commands = _commands(parser)
    assert {"serve", "llm", "build", "completion"} <= set(commands)
    for name, sub in commands.items():
        assert name in text, name
        for action in sub._actions:
            if action.help != argparse.SUPPRESS:
                for flag in action.option_strings:  # fish spells --flag as -l flag
                    assert flag.lstrip("-") in text, (name, flag)


def test_a_command_added_to_the_parser_completes_without_editing_the_generator(
        tmp_path: Path) -> None:
    parser = cli.build_parser()
    parser.add_argument("--profile", metavar="NAME")  # a root flag that takes a value
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    sub.add_parser("frobnicate").add_argument("--widget", metavar="FILE")
    script = _write(tmp_path, "bash", parser)
    (tmp_path / "w.txt").touch()
    assert bash_complete(script, "fro") == ["frobnicate"]
    assert bash_complete(script, "frobnicate", "--wid") == ["--widget"]
    assert bash_complete(script, "frobnicate", "--widget", "w", cwd=tmp_path) == ["w.txt"]
    # 'serve' is --profile's value, not the command: the root has no --max- flag
    assert bash_complete(script, "--profile", "serve", "--max-") == []


@pytest.mark.parametrize(("metavar", "kind"), [
    ("FILE", "file"), ("NAME=FILE", "file"), ("PATH|-", "file"), ("MODEL.onnx", "file"),
    ("OUT", "file"), ("GEAR", "file"), ("DIR", "dir"), ("MODEL_DIR", "dir"),
    ("HF_FOLDER", "dir"), ("IN=OUT", "value"), ("N", "value"), ("NAME:D,D;...", "value"),
    (("BEFORE.json", "AFTER.json"), "file")])
def test_the_metavar_says_what_a_value_completes_to(metavar, kind: str) -> None:
    nargs = len(metavar) if isinstance(metavar, tuple) else None
    action = argparse.ArgumentParser().add_argument("--x", metavar=metavar, nargs=nargs)
    assert completion.value_kind(action) == kind


# ---- zsh and fish, where installed ------------------------------------------------------------
def _shell_run(tmp_path: Path, shell: str, code: str) -> list[str]:
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed")
    script = _write(tmp_path, shell)
    done = subprocess.run([shell, "-c", code.replace("SCRIPT", str(script))],
                          capture_output=True, text=True, cwd=tmp_path, timeout=30)
    assert done.returncode == 0 and not done.stderr, done.stderr
    return done.stdout.splitlines()


def test_zsh_offers_commands_with_their_help_and_flags(tmp_path: Path) -> None:
    def offered(words: str) -> list[str]:
        return _shell_run(tmp_path, "zsh", f"{ZSH_STUBS}source SCRIPT\nwords=({words})\n"
                          "CURRENT=${#words}\n_gear_runtime")

    assert "serve:serve gear files over HTTP and gRPC" in offered("gear-runtime se")
    assert any(o.startswith("--max-sequences:") for o in offered("gear-runtime serve --max-"))
    assert offered("gear-runtime llm build x -o ''") == ["_files -/"]
    assert offered("gear-runtime completion ''") == list(completion.SHELLS)


def test_fish_completes_commands_and_flags(tmp_path: Path) -> None:
    def offered(line: str) -> list[str]:
        out = _shell_run(tmp_path, "fish", f"source SCRIPT; complete -C '{line}'")
        return [o.split("\t")[0] for o in out]

    assert offered("gear-runtime se") == ["serve"]
    assert "--max-sequences" in offered("gear-runtime serve --max-")
    assert offered("gear-runtime llm b") == ["build"]
    assert sorted(offered("gear-runtime completion ")) == sorted(completion.SHELLS)
