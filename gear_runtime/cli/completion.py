"""``gear-runtime completion bash|zsh|fish``: the shell completion script, on stdout.

The script is generated from the argparse parser itself (:func:`gear_runtime.cli.app.
build_parser`), so a new command or flag completes without editing this module: the
subcommands (``llm build`` too), each command's flags (not the hidden ones,
``help=argparse.SUPPRESS``), a flag's choices, and file or folder names where a flag or a
positional takes a path (:func:`value_kind` reads that from the metavar: ``FILE``,
``MODEL.onnx``, ``DIR``, ...). No dependency: each shell's script is a few functions around
``case`` tables of that data.

    source <(gear-runtime completion bash)        # in ~/.bashrc
    source <(gear-runtime completion zsh)         # in ~/.zshrc, after compinit
    gear-runtime completion fish > ~/.config/fish/completions/gear-runtime.fish
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field

from gear_runtime.cli.common import EXIT_OK, PROG

#: The shells a script is generated for.
SHELLS = ("bash", "zsh", "fish")
#: The shell function names derive from this (``gear-runtime`` is no valid name in bash).
FUNC = "_" + re.sub(r"\W", "_", PROG)

# A metavar names a folder (DIR, MODEL_DIR, HF_FOLDER) or a file (FILE, NAME=FILE, PATH|-,
# OUT, GEAR, or any NAME.ext: MODEL.onnx, OUT.png); IN=OUT and NAME:D,D;... are not paths.
_DIR_METAVAR = re.compile(r"(DIR|FOLDER)$")
_FILE_METAVAR = re.compile(r"(^|=)(FILE|PATH)$|^(OUT|GEAR)$|\.\w+$")


@dataclass(frozen=True)
class Option:
    """One flag: its spellings, what its value completes to (:func:`value_kind`; ``""``: it
    takes no value) and its help's first clause."""

    names: tuple[str, ...]
    kind: str
    help: str


@dataclass
class Node:
    """One command (``()`` the root, ``("llm", "build")``): its subcommands (name -> help),
    its flags, and what its positional arguments complete to."""

    path: tuple[str, ...]
    commands: dict[str, str] = field(default_factory=dict)
    options: list[Option] = field(default_factory=list)
    positional: str = ""

    @property
    def key(self) -> str:
        """The command path as the scripts spell it: the words joined by one space."""
        return " ".join(self.path)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The ``completion`` command's one argument."""
    p = sub.add_parser("completion", help="print the shell completion script (bash, zsh, fish)",
                       description="Print the completion script of gear-runtime for SHELL, "
                       "generated from this version's own command line. Enable it with "
                       "'source <(gear-runtime completion bash)' (bash, in ~/.bashrc), the "
                       "same with zsh (in ~/.zshrc, after compinit), or 'gear-runtime "
                       "completion fish > ~/.config/fish/completions/gear-runtime.fish'.")
    p.add_argument("shell", choices=SHELLS, metavar="SHELL", help="bash, zsh or fish")
    p.set_defaults(handler=cmd_completion)


def cmd_completion(args: argparse.Namespace) -> int:
    """Print the script of ``args.shell`` for the whole ``gear-runtime`` parser; exit 0."""
    sys.stdout.write(script(args.shell, args.parser))  # set by cli.app.main
    return EXIT_OK


def script(shell: str, parser: argparse.ArgumentParser) -> str:
    """The completion script of ``parser`` for ``shell`` (one of :data:`SHELLS`)."""
    nodes = list(walk(parser))
    return {"bash": _bash, "zsh": _zsh, "fish": _fish}[shell](nodes)


# ---- the parser as data -------------------------------------------------------------------
def walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[Node]:
    """Every command of ``parser``, the root first, then each subcommand depth first.

    Reads argparse's ``_actions`` and ``_choices_actions``: it has no public way to list
    them, and these have not changed since Python 3.2 (shtab and argcomplete read them too)."""
    node = Node(path)
    children: list[tuple[str, argparse.ArgumentParser]] = []
    for action in parser._actions:
        if action.help == argparse.SUPPRESS:
            continue  # internal flags (serve's --worker-*) are not offered
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            node.commands = {name: _clause(helps.get(name, "")) for name in action.choices}
            children += list(action.choices.items())
        elif action.option_strings:
            node.options.append(Option(tuple(action.option_strings), value_kind(action),
                                       _clause(action.help or "")))
        elif not node.positional:
            node.positional = value_kind(action)
    yield node
    for name, child in children:
        yield from walk(child, (*path, name))


def value_kind(action: argparse.Action) -> str:
    """What the value of ``action`` completes to: ``""`` (a flag: no value), ``"file"``,
    ``"dir"``, ``"choice A B ..."`` (its choices) or ``"value"`` (free text: nothing)."""
    if action.nargs == 0:
        return ""
    if action.choices is not None:
        return "choice " + " ".join(str(c) for c in action.choices)
    metavar = action.metavar if action.metavar is not None else action.dest.upper()
    if isinstance(metavar, tuple):
        metavar = metavar[0]
    name = metavar.split("|")[0]  # PATH|- : a path or stdout
    if _DIR_METAVAR.search(name):
        return "dir"
    return "file" if _FILE_METAVAR.search(name) else "value"


def _clause(text: str) -> str:
    """A help text's first clause, for the menus of zsh and fish (one short line)."""
    text = " ".join(text.replace("%%", "%").split())
    text = re.split(r"; | \(|\. ", text)[0]
    return text if len(text) <= 60 else text[:57] + "..."


# ---- the tables both bash and zsh read (their ``case`` is the same) -----------------------
def _sh_tables(nodes: list[Node]) -> str:
    """``FUNC_commands PATH``, ``FUNC_options PATH``, ``FUNC_positional PATH`` print words;
    ``FUNC_value PATH FLAG`` prints the flag's value kind. Each fails where it has none."""
    values = [([f"{n.key}|{s}" for s in o.names], o.kind) for n in nodes for o in n.options
              if o.kind]
    return "".join([
        _sh_table("commands", '"$1"', [([n.key], " ".join(n.commands))
                                       for n in nodes if n.commands]),
        _sh_table("options", '"$1"', [([n.key], " ".join(s for o in n.options for s in o.names))
                                      for n in nodes]),
        _sh_table("positional", '"$1"', [([n.key], n.positional) for n in nodes
                                         if n.positional]),
        _sh_table("value", '"$1|$2"', values),
    ])


def _sh_table(name: str, subject: str, rows: list[tuple[list[str], str]]) -> str:
    """A function that prints the text of the row whose keys match ``subject``."""
    cases = "".join(f"        {'|'.join(map(shlex.quote, keys))}) echo {shlex.quote(out)} ;;\n"
                    for keys, out in rows)
    return (f"{FUNC}_{name}() {{\n    case {subject} in\n{cases}        *) return 1 ;;\n"
            "    esac\n}\n")


# The command path typed before the cursor: the subcommand words, skipping every flag and
# the value of a flag that takes one (``--name run`` is no ``run`` command). Words in $WORDS
# from index $FIRST to before $LAST; the same loop in bash and zsh.
_SH_WALK = """    local cmdpath="" word kind i
    for ((i = FIRST; i < LAST; i++)); do
        word=${WORDS[i]}
        if [[ $word == -* ]]; then
            if [[ $word != *=* ]] && FUNC_value "$cmdpath" "$word" >/dev/null; then
                ((i += 1))
            fi
        elif [[ " $(FUNC_commands "$cmdpath") " == *" $word "* ]]; then
            cmdpath="${cmdpath:+$cmdpath }$word"
        fi
    done
"""


def _sh_walk(words: str, first: str, last: str) -> str:
    return (_SH_WALK.replace("FUNC", FUNC).replace("WORDS", words)
            .replace("FIRST", first).replace("LAST", last))


_BASH_MAIN = """FUNC_reply() {  # COMPREPLY from stdin, one word a line (file names may hold spaces)
    local line
    COMPREPLY=()
    while IFS= read -r line; do COMPREPLY+=("$line"); done
}

FUNC() {
    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
WALK    # --flag=value: bash splits the word at '='
    if [[ $prev == "=" && COMP_CWORD -ge 2 ]]; then prev=${COMP_WORDS[COMP_CWORD-2]}; fi
    if [[ $prev == -* ]] && kind=$(FUNC_value "$cmdpath" "$prev"); then
        FUNC_complete "$kind" "$cur"
    elif [[ $cur == -* ]]; then
        FUNC_reply < <(compgen -W "$(FUNC_options "$cmdpath")" -- "$cur")
    elif kind=$(FUNC_commands "$cmdpath"); then
        FUNC_reply < <(compgen -W "$kind" -- "$cur")
    else
        FUNC_complete "$(FUNC_positional "$cmdpath")" "$cur"
    fi
    return 0
}

FUNC_complete() {  # $1 a value kind, $2 the word typed so far
    case $1 in
        file) compopt -o filenames 2>/dev/null; FUNC_reply < <(compgen -f -- "$2") ;;
        dir) compopt -o filenames 2>/dev/null; FUNC_reply < <(compgen -d -- "$2") ;;
        choice\\ *) FUNC_reply < <(compgen -W "${1#choice }" -- "$2") ;;
        *) COMPREPLY=() ;;  # free text: nothing to offer
    esac
}

complete -F FUNC PROG
"""


def _bash(nodes: list[Node]) -> str:
    main = _BASH_MAIN.replace("WALK", _sh_walk("COMP_WORDS", "1", "COMP_CWORD"))
    return (f"# bash completion of {PROG} (generated by '{PROG} completion bash')\n"
            + _sh_tables(nodes) + "\n" + main.replace("FUNC", FUNC).replace("PROG", PROG))


_ZSH_MAIN = """FUNC() {
    local cur=${words[CURRENT]} prev=${words[CURRENT-1]}
    local -a descr
WALK    if [[ $prev == -* ]] && kind=$(FUNC_value "$cmdpath" "$prev"); then
        FUNC_complete "$kind"
    elif [[ $cur == -* ]]; then
        FUNC_described "$cmdpath|options"
        _describe -t options option descr
    elif FUNC_commands "$cmdpath" >/dev/null; then
        FUNC_described "$cmdpath|commands"
        _describe -t commands command descr
    else
        FUNC_complete "$(FUNC_positional "$cmdpath")"
    fi
}

FUNC_complete() {  # $1 a value kind
    case $1 in
        file) _files ;;
        dir) _files -/ ;;
        choice\\ *) compadd -- ${=1#choice } ;;
        *) _message value ;;
    esac
}

if [[ $funcstack[1] == _PROG ]]; then  # autoloaded from $fpath as _PROG
    FUNC "$@"
else
    compdef FUNC PROG
fi
"""


def _zsh(nodes: list[Node]) -> str:
    """zsh: the same tables and walk as bash (zsh's ``words`` starts at 1), with each
    command's and flag's help in the menu."""
    lines = []
    for n in nodes:
        for what, items in (("commands", n.commands.items()),
                            ("options", [(s, o.help) for o in n.options for s in o.names])):
            specs = " ".join(shlex.quote(f"{name}:{text}") for name, text in items)
            lines.append(f"        {shlex.quote(f'{n.key}|{what}')}) descr=({specs}) ;;\n")
    described = (f"{FUNC}_described() {{  # descr: NAME:HELP of $1 (PATH|commands, "
                 f"PATH|options)\n    case \"$1\" in\n{''.join(lines)}    esac\n}}\n")
    main = _ZSH_MAIN.replace("WALK", _sh_walk("words", "2", "CURRENT"))
    return (f"#compdef {PROG}\n# zsh completion of {PROG} (generated by '{PROG} completion "
            f"zsh')\n" + _sh_tables(nodes) + described + "\n"
            + main.replace("FUNC", FUNC).replace("PROG", PROG))


# ---- fish ---------------------------------------------------------------------------------
_FISH_PATH = """function FUNC_path  # the command path typed before the cursor, as in bash
    set -l cmdpath ''
    set -l skip 0
    for word in (commandline -opc)[2..-1]
        if test $skip = 1
            set skip 0
        else if string match -q -- '-*' $word
            if not string match -q -- '*=*' $word; and FUNC_value "$cmdpath" $word >/dev/null
                set skip 1
            end
        else if contains -- $word (FUNC_commands "$cmdpath")
            set cmdpath (string trim -- "$cmdpath $word")
        end
    end
    echo $cmdpath
end

function FUNC_at  # is the command path $argv[1]?
    set -l cmdpath (FUNC_path)
    test "$cmdpath" = "$argv[1]"
end

complete -c PROG -f
"""


def _fish(nodes: list[Node]) -> str:
    """fish: a ``complete`` line per subcommand and per flag, each under the condition that
    the command path typed so far is its command's."""
    tables = [_fish_table("commands", [([n.key], list(n.commands)) for n in nodes if n.commands]),
              _fish_table("value", [([f"{n.key}|{s}" for s in o.names], [o.kind])
                                    for n in nodes for o in n.options if o.kind])]
    lines = [line for n in nodes for line in _fish_lines(n)]
    return (f"# fish completion of {PROG} (generated by '{PROG} completion fish')\n"
            + "".join(tables) + _FISH_PATH.replace("FUNC", FUNC).replace("PROG", PROG)
            + "\n".join(lines) + "\n")


def _fish_quote(text: str) -> str:
    """``text`` in fish's single quotes (where a backslash escapes ``'`` and itself)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _fish_table(name: str, rows: list[tuple[list[str], list[str]]]) -> str:
    """A function that prints the lines of the row whose keys match its arguments joined
    by ``|``."""
    cases = "".join(f"        case {' '.join(map(_fish_quote, keys))}\n"
                    f"            printf '%s\\n' {' '.join(map(_fish_quote, out))}\n"
                    for keys, out in rows)
    return (f"function {FUNC}_{name}\n    switch (string join '|' -- $argv)\n{cases}"
            "        case '*'\n            return 1\n    end\nend\n\n")


def _fish_lines(node: Node) -> Iterator[str]:
    head = f"complete -c {PROG} -n {_fish_quote(f'{FUNC}_at ' + _fish_quote(node.key))}"
    for name, text in node.commands.items():
        yield f"{head} -a {_fish_quote(name)} -d {_fish_quote(text)}"
    for option in node.options:
        value = _fish_value(option.kind) if option.kind else ""
        spellings = " ".join(map(_fish_spelling, option.names))
        yield " ".join(filter(None, [head, spellings, value, "-d", _fish_quote(option.help)]))
    if node.positional in ("file", "dir") or node.positional.startswith("choice "):
        yield f"{head} {_fish_value(node.positional).removeprefix('-r ').removeprefix('-x ')}"


def _fish_spelling(flag: str) -> str:
    """``--long`` as ``-l long``, ``-s`` as ``-s s``, ``-old`` as ``-o old``."""
    if flag.startswith("--"):
        return f"-l {flag[2:]}"
    return f"-s {flag[1:]}" if len(flag) == 2 else f"-o {flag[1:]}"


def _fish_value(kind: str) -> str:
    """The ``complete`` arguments of a flag's value of ``kind``."""
    if kind == "file":
        return "-r -F"
    if kind == "dir":
        return "-x -a '(__fish_complete_directories)'"
    if kind.startswith("choice "):
        return f"-x -a {_fish_quote(kind[len('choice '):])}"
    return "-x"
