"""The ``interp`` command: a thin dispatcher over ``interp.cli.<name>`` modules.

Each command module defines ``HELP`` (one line), ``add_arguments(parser)`` and
``run(args) -> int``, and follows the output contract of :mod:`interp.cli.output`: arguments
and ``--out`` are checked before any model loads, files are staged and moved into place
together. Exit codes (docs/commands.md): 0 ok, 1 the work failed (one line on stderr),
2 the command line was refused (argparse, or a ``UsageError`` before any work),
130 interrupted (nothing written).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import re
import sys

# command name -> module implementing it; all are imported to build the parser, so they import
# nothing heavy at the top (torch, pandas... only in run(): docs/commands.md, "Start-up")
COMMANDS = {
    "induction": "interp.cli.induction",
    "attention": "interp.cli.attention",
    "circuits": "interp.cli.circuits",
    "attribute": "interp.cli.attribute",
    "patch": "interp.cli.patch",
    "task": "interp.cli.task",
    "discover": "interp.cli.discover",
    "features": "interp.cli.features",
    "merge": "interp.cli.merge",
    "graph": "interp.cli.graph",
    "models": "interp.cli.models",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="interp",
        description="Mechanistic interpretability of transformers: induction "
        "heads, logit attribution, QK/OV circuits and attention views.",
    )
    from interp import __version__  # a constant: importing interp imports nothing heavy

    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    parser.add_argument("--version", action="version", version=f"interp {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(module_name)
        command = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(command)
        # -v after the command too; SUPPRESS: when left out here, the one before it stands
        command.add_argument(
            "-v",
            "--verbose",
            action="store_true",
            default=argparse.SUPPRESS,
            help="log what happens",
        )
        for action in command._actions:
            _describe(action)
        command.set_defaults(run=module.run)
    return parser


def _shown_default(value) -> str:
    if isinstance(value, list | tuple):
        return ",".join(map(str, value))
    return str(value)


def _describe(action: argparse.Action) -> None:
    """Add to an option's help the default and the range it lacks (``(default 5; from 1 to
    100)``), from the option itself: --help never leaves them to be guessed."""
    if not action.option_strings or action.help in (None, argparse.SUPPRESS):
        return
    if isinstance(action, argparse._StoreTrueAction | argparse._HelpAction):
        return
    text, parts = action.help, []
    default = action.default
    if default not in (None, argparse.SUPPRESS) and _shown_default(default) not in text:
        parts.append(f"default {_shown_default(default)}")
    bounds = getattr(action.type, "bounds", None)
    if bounds and bounds.removeprefix("each ").removeprefix("from ") not in text:
        parts.append(bounds)
    if (
        action.choices is not None
        and default is None
        and not action.required
        and ("default" not in text)
    ):
        parts.append("default: none")
    if parts:
        action.help = f"{text} ({'; '.join(parts)})"


# options that name files or folders: any bytes the file system takes are fine there
PATH_OPTIONS = {"out", "model", "task", "transcoders", "sae", "text", "shards", "prompts"}


def _not_utf8(args: argparse.Namespace) -> str | None:
    """The first text option the shell handed over as bytes that are not UTF-8 (Python keeps
    them as lone surrogates), as the user typed it, or None."""
    for name, value in vars(args).items():
        if name in PATH_OPTIONS:
            continue
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str) and any("\udc80" <= ch <= "\udcff" for ch in item):
                return f"--{name.replace('_', '-')}" if name != "kind" else name
    return None


def _flags(parser: argparse.ArgumentParser, command: str) -> dict[str, str]:
    """``dest -> --option`` of ``command``'s options (``max_bytes -> --max-bytes``)."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {
        action.dest: max(action.option_strings, key=len)
        for action in sub.choices[command]._actions
        if action.option_strings and action.dest != "help"
    }


def as_flags(message: str, flags: dict[str, str]) -> str:
    """A library message as the command line's user reads it: the Python parameters it names
    written as the options they typed (``raise max_bytes to 2 MiB`` -> ``raise --max-bytes to
    2 MiB``; ``max_bytes=1000 B`` -> ``--max-bytes 1000 B``; ``pass other names=`` -> ``pass
    other --names``). Only parameters the command has as options, and plain words only with
    an underscore (``max_feature_nodes``), so that prose stays prose."""
    for dest, flag in flags.items():
        message = re.sub(rf"(?<![\w-]){dest}=(?=[\s,;.)]|$)", flag, message)
        message = re.sub(rf"(?<![\w-]){dest}=", f"{flag} ", message)
        if "_" in dest:
            message = re.sub(rf"(?<![\w-]){dest}\b", flag, message)
    return message


def main(argv: list[str] | None = None) -> int:
    from interp.cli.options import attach_values

    parser = build_parser()
    args = parser.parse_args(attach_values(sys.argv[1:] if argv is None else argv))
    bad = _not_utf8(args)
    if bad is not None:  # the tokenizer would fail later with a type error naming nothing
        print(
            f"interp {args.command}: error: {bad} is not valid UTF-8 text; pass it in UTF-8 "
            "(check the terminal's or the script's encoding)",
            file=sys.stderr,
        )
        return 2
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    from interp.cli.output import UsageError, committed

    committed(reset=True)
    flags = _flags(parser, args.command)
    try:
        return int(args.run(args) or 0)
    except UsageError as exc:  # argparse's format and code: the command line is wrong
        print(f"interp {args.command}: error: {as_flags(str(exc), flags)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        written = committed()
        if written:  # the Ctrl-C came after the outputs were in place: the work is done
            for path in written:
                print(f"wrote {path}")
            print("interp: interrupted after every file was written", file=sys.stderr)
            return 0
        print("interp: interrupted; nothing was written", file=sys.stderr)
        return 130
    except Exception as exc:  # one clear line for the user; --verbose shows the traceback
        if args.verbose:
            raise
        print(f"interp {args.command}: error: {as_flags(str(exc), flags)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
