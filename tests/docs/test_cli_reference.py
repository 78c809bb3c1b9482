"""The command-line reference (docs/reference/cli.md) is what scripts/cli_reference.py renders
from the argument parser now, and its tables hold every option of every command."""

from __future__ import annotations

import argparse
import importlib.util
import re
from pathlib import Path

from metagen.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("cli_reference", ROOT / "scripts" / "cli_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REFERENCE = _script()


def _cells(row: str) -> list[str]:
    """The cells of a markdown table row (an escaped pipe stays inside its cell)."""
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", row.strip())[1:-1]]


def test_committed_page_is_the_generated_one() -> None:
    page = ROOT / "docs" / "reference" / "cli.md"
    assert page.is_file(), "docs/reference/cli.md is missing: run python scripts/cli_reference.py"
    assert page.read_text(encoding="utf-8") == REFERENCE.render(), (
        "docs/reference/cli.md is out of date with the parser: run python scripts/cli_reference.py")


def _commands(parser: argparse.ArgumentParser, path: str = "") -> list[tuple[str, argparse.ArgumentParser]]:
    """(words after `metagen`, parser) of every command, nested ones (`theory bon`) included."""
    found = []
    for name, _, command in REFERENCE.subcommands(parser):
        found += [(f"{path} {name}".strip(), command)] + _commands(command, f"{path} {name}".strip())
    return found


def test_every_option_of_every_command_is_a_row() -> None:
    text = REFERENCE.render()
    sections = {section.split("\n", 1)[0]: section.splitlines()
                for section in re.split(r"^## metagen ", text, flags=re.MULTILINE)[1:]}
    commands = _commands(build_parser())
    assert list(sections) == [path for path, _ in commands]
    assert "theory bon" in sections and "generate" in sections
    for path, parser in commands:
        options = [_cells(line) for line in sections[path] if line.startswith("| `")]
        assert all(len(cells) == 4 for cells in options), path  # no help text split a row
        shown = {cells[0].strip("`").split(" ")[0].rstrip(",") for cells in options}
        wanted = {(action.option_strings or [action.dest])[0] for action in parser._actions
                  if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction))}
        assert shown == wanted, path
        listed = {re.match(r"\| \[`([^`]+)`\]", line).group(1) for line in sections[path] if line.startswith("| [`")}
        assert listed == {f"{path} {name}" for name, _, _ in REFERENCE.subcommands(parser)}, path


def test_a_row_states_help_default_and_choices() -> None:
    text = REFERENCE.render()
    generate = text.split("## metagen generate", 1)[1].split("## metagen eval", 1)[0]
    assert ("| `--aggregation {best,majority,weighted}` | tree search: pick the leaf of best value, or vote over "
            "the leaves' answers (majority, value-weighted) | `'best'` | `best`, `majority`, `weighted` |") in generate
    # a pipe inside the help is escaped, not a new cell; a required positional says so
    assert "| `prompt` | the prompt (wrapped in the chat template unless --no-chat) | required |  |" in generate
    assert "steps \\| judge \\| prm:PATH" in generate
    evaluation = text.split("## metagen eval", 1)[1].split("## metagen serve", 1)[0]
    # a required exclusive group says so above its table
    parser = argparse.ArgumentParser(prog="x")
    either = parser.add_mutually_exclusive_group(required=True)
    either.add_argument("--data")
    either.add_argument("--task")
    assert "Exactly one of `--data`, `--task`." in REFERENCE._command_section("x", "x", parser)
    assert "\n### Remote backend (an OpenAI-compatible server: " in evaluation  # a named group, its own table


def test_escape_keeps_code_spans() -> None:
    assert REFERENCE._escape("a *b* <c> `x|*y*` d|e") == "a \\*b\\* &lt;c> `x\\|*y*` d\\|e"
