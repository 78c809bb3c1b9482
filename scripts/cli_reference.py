"""Write the command-line reference (docs/reference/cli.md) from metagen's argument parser.

    python scripts/cli_reference.py          # (re)write the page
    python scripts/cli_reference.py --check  # exit 1 when the page is missing or out of date

The page is read off the parser `metagen.cli.build_parser()` builds, not written by hand: every
command in the order `metagen --help` lists them, its description (or its one-line help), then
one table per argument group of the command, as argparse groups them in `metagen COMMAND --help`
(positional arguments, options, then the named groups such as "remote backend"), each option
with its help, default and choices; a command with commands of its own (`metagen theory bon`)
lists them, and each gets its section. An option is written as argparse writes it in the help
(`--top-p TOP_P`, `--chat, --no-chat`), so the page and `--help` agree; a positional argument
by its name. -h/--help, which every
command has, is left out. tests/docs/test_cli_reference.py compares the committed page with what
this script renders, so a new flag is on the page as soon as the page is regenerated.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "reference" / "cli.md"

CODE_SPAN = re.compile(r"(`[^`]*`)")


def _escape(text: str) -> str:
    """`text` safe in a markdown table cell: outside code spans, characters markdown would read
    (emphasis, links, HTML) are escaped; pipes are escaped everywhere (they split cells) and
    newlines become spaces."""
    parts = CODE_SPAN.split(" ".join(text.split()))
    for index, part in enumerate(parts):
        if index % 2:  # a code span: literal, only the cell separator escaped
            parts[index] = part.replace("|", "\\|")
        else:
            part = part.replace("\\", "\\\\")
            for character in "*_[]|":
                part = part.replace(character, "\\" + character)
            parts[index] = part.replace("<", "&lt;")
    return "".join(parts)


def _code(text: str) -> str:
    """`text` as an inline code span in a table cell."""
    return "`" + text.replace("|", "\\|") + "`"


def _default(action: argparse.Action) -> str:
    """The default cell: "required", nothing for "not given" (None, a flag's False), else the value."""
    if action.required:
        return "required"
    default = action.default
    if default is None or default is False or default == argparse.SUPPRESS:
        return ""
    if isinstance(default, str):
        return _code(repr(default))
    return _code(str(default))


def _choices(action: argparse.Action) -> str:
    if action.choices is None:
        return ""
    return ", ".join(_code(str(choice)) for choice in action.choices)


def _help(action: argparse.Action, prog: str) -> str:
    """The help text as `--help` prints it (%(default)s and the like expanded), with a note for
    an option that may be repeated."""
    text = action.help or ""
    if "%" in text:
        values = {**vars(action), "prog": prog}
        values["choices"] = ", ".join(map(str, action.choices)) if action.choices is not None else ""
        text = text % values
    if isinstance(action, argparse._AppendAction) and "repeat" not in text:
        text = (text.rstrip(". ") + ". Repeatable." if text else "Repeatable.")
    return _escape(text)


def _group_table(actions: list[argparse.Action], formatter: argparse.HelpFormatter, prog: str) -> list[str]:
    heading = "Option" if any(action.option_strings for action in actions) else "Argument"
    lines = [f"| {heading} | Help | Default | Choices |", "|---|---|---|---|"]
    for action in actions:
        # an option as `--help` writes it; a positional by its name (its choices are a column)
        invocation = (formatter._format_action_invocation(action) if action.option_strings
                      else action.metavar or action.dest)
        lines.append(f"| {_code(invocation)} | {_help(action, prog)} | {_default(action)} | {_choices(action)} |")
    return lines


def _shown(action: argparse.Action) -> bool:
    return (not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction))
            and action.help != argparse.SUPPRESS)


def subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one-line help, parser) of each command `parser` dispatches to, in the order `--help`
    lists them (none for a parser without subcommands)."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            summaries = {choice.dest: choice.help or "" for choice in action._choices_actions}
            found += [(name, summaries.get(name, ""), command) for name, command in action.choices.items()]
    return found


def _anchor(path: str) -> str:
    return "metagen-" + path.replace(" ", "-")


def _sentence(text: str) -> str:
    return _escape(text[:1].upper() + text[1:]) + "." if text else ""


def _command_section(path: str, summary: str, parser: argparse.ArgumentParser) -> list[str]:
    """One command (`path`: its words after `metagen`): its heading, description (or its help
    line), its own commands if it has some, a table per argument group; then each of its commands."""
    lines = [f"## metagen {path}", ""]
    description = parser.description
    if description is None:
        lines += [_sentence(summary), ""]
    elif isinstance(parser.formatter_class, type) and issubclass(parser.formatter_class,
                                                                 argparse.RawDescriptionHelpFormatter):
        lines += [_sentence(summary), "", "```text", description, "```", ""]
    else:
        lines += [_escape(description), ""]
    nested = subcommands(parser)
    if nested:
        lines += ["| Command | What it does |", "|---|---|"]
        lines += [f"| [`{path} {name}`](#{_anchor(f'{path} {name}')}) | {_escape(text)} |"
                  for name, text, _ in nested]
        lines.append("")
    formatter = parser._get_formatter()
    for group in parser._action_groups:
        actions = [action for action in group._group_actions if _shown(action)]
        if not actions:
            continue
        title = "options" if group.title == "optional arguments" else group.title  # Python < 3.10's name
        lines += [f"### {title[:1].upper() + title[1:]}", ""]
        if group.description:
            lines += [_escape(group.description), ""]
        exclusive = [exclusive for exclusive in parser._mutually_exclusive_groups
                     if any(action in actions for action in exclusive._group_actions)]
        for choice in exclusive:
            names = ", ".join(_code(action.option_strings[0]) for action in choice._group_actions)
            lines += [f"{'Exactly' if choice.required else 'At most'} one of {names}.", ""]
        lines += _group_table(actions, formatter, parser.prog) + [""]
    for name, text, command in nested:
        lines += _command_section(f"{path} {name}", text, command)
    return lines


def render() -> str:
    """The markdown of docs/reference/cli.md."""
    from metagen.cli import build_parser

    parser = build_parser()
    lines = [
        "# Command line",
        "",
        "<!-- Written by scripts/cli_reference.py from metagen's argument parser; edit the parser or the "
        "script, not this page. -->",
        "",
        f"{_escape(parser.description)} `metagen COMMAND --help` prints the same options; every command "
        "also takes `-h`, `--help`. An empty default means the option is off or not given; where it then "
        "falls back to a value, the help says which.",
        "",
        "| Command | What it does |",
        "|---|---|",
    ]
    commands = subcommands(parser)
    lines += [f"| [`{name}`](#{_anchor(name)}) | {_escape(text)} |" for name, text, _ in commands]
    lines.append("")
    for name, text, command in commands:
        lines += _command_section(name, text, command)
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not PAGE.is_file() or PAGE.read_text(encoding="utf-8") != text:
            print(f"{PAGE.relative_to(ROOT)} is out of date: run python scripts/cli_reference.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))  # this checkout's metagen, whichever one is installed
    sys.exit(main(sys.argv[1:]))
