"""Griffe extension for the API reference (mkdocs.yml, mkdocstrings `extensions:`): metagen's
docstrings are prose with formulas written inline, and a few characters of that notation mean
something else in Markdown. Outside code (backtick spans, indented and fenced blocks) it turns

    q[i](x), U[i][j]    an opening bracket right after a name, `)` or `]` -> &#91;
                        (Markdown would read "[i](x)" as a link and "[i][j]" as a reference)
    <key>, y_<t         `<` -> &lt; (Markdown would read "<key>" as an HTML tag and drop it)

so the page shows what the docstring says. LaTeX written as $...$ / $$...$$ is left alone (the
site typesets it); help() and the source still show the docstring as written.
"""

from __future__ import annotations

import re

from griffe import Extension

_INDEXING = re.compile(r"(?<=[\w)\]])\[")
_CODE_SPAN = re.compile(r"(`+)(?:.|\n)*?(?<!`)\1(?!`)")
_MATH = re.compile(r"\$\$(?:.|\n)*?\$\$|\$[^\s$](?:[^$\n]*?[^\s$])?\$")
_FENCE = re.compile(r"^\s*(```|~~~)")


def _escape_text(text: str) -> str:
    """Escape one run of prose (no code, no math in it)."""
    return _INDEXING.sub("&#91;", text.replace("<", "&lt;"))


def _escape_line_run(text: str) -> str:
    """Escape prose, keeping code spans and $-math as they are."""
    pieces, position = [], 0
    protected = sorted([*(_CODE_SPAN.finditer(text)), *(_MATH.finditer(text))], key=lambda match: match.start())
    for match in protected:
        if match.start() < position:
            continue  # inside an earlier protected piece
        pieces.append(_escape_text(text[position:match.start()]))
        pieces.append(match.group(0))
        position = match.end()
    pieces.append(_escape_text(text[position:]))
    return "".join(pieces)


def escape_prose(docstring: str) -> str:
    """The docstring with Markdown-significant notation escaped outside code blocks."""
    lines = docstring.split("\n")
    out: list[str] = []
    prose: list[str] = []
    in_fence = False
    previous_blank = True
    in_indented = False

    def flush() -> None:
        if prose:
            out.append(_escape_line_run("\n".join(prose)))
            prose.clear()

    for line in lines:
        blank = not line.strip()
        if _FENCE.match(line):
            flush()
            in_fence = not in_fence
            out.append(line)
        elif in_fence:
            out.append(line)
        elif (line.startswith("    ") and (previous_blank or in_indented)) or (in_indented and blank):
            # an indented code block: after a blank line, until a non-blank line that is not indented
            flush()
            in_indented = True
            out.append(line)
        else:
            in_indented = False
            prose.append(line)
        previous_blank = blank
    flush()
    return "\n".join(out)


class ProseDocstrings(Extension):
    """Applies `escape_prose` to every docstring griffe loads."""

    def on_object(self, *, obj, **kwargs) -> None:
        if obj.docstring is not None and not obj.is_alias:
            obj.docstring.value = escape_prose(obj.docstring.value)
