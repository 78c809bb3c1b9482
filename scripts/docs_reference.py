"""Write the API reference pages (docs/reference/<page>.md) from the package layout.

    python scripts/docs_reference.py          # (re)write the pages
    python scripts/docs_reference.py --check  # exit 1 when a page is missing or out of date

One page per public package: the package's docstring, then one `::: metagen.<package>.<module>`
block (mkdocstrings) per public module, i.e. every module of the package whose name does not
start with an underscore, in alphabetical order. Which members a module shows is mkdocstrings'
`filters: public` (mkdocs.yml): the names of `__all__` where a module has one, else the names
without a leading underscore, imported names left out. tests/docs/test_site.py runs `--check`, so
a new module is in the reference as soon as it exists.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "src" / "metagen"
REFERENCE = ROOT / "docs" / "reference"

# page -> (title, the packages it shows: each docstring, then each public module)
PAGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "decoding": ("Decoding loops and results", ("decoding",)),
    "sampling": ("Sampling adapters and the sampler chain", ("sampling",)),
    "strategies": ("Meta-generation strategies", ("strategies",)),
    "tree": ("Tree search and controlled decoding", ("strategies.tree",)),
    "speculative": ("Speculative decoding", ("speculative",)),
    "scoring": ("Scorers, verifiers and value models", ("scoring",)),
    "eval": ("Evaluation", ("eval",)),
    "serve": ("The OpenAI-compatible server", ("serve",)),
    "remote": ("Remote servers and fleets", ("remote",)),
    "models": ("Models, caches and weight formats", ("models", "models.families", "models.kernels")),
    "theory": ("Theory", ("theory",)),
    "structured": ("Structured outputs", ("structured",)),
    "compress": ("Compression", ("compress",)),
    "tools": ("Tools and retrieval", ("tools", "retrieval")),
}


def public_modules(package: str) -> list[str]:
    """Dotted names of the public modules directly inside `metagen.<package>` (no subpackages)."""
    folder = SOURCE.joinpath(*package.split("."))
    return [f"metagen.{package}.{path.stem}" for path in sorted(folder.glob("*.py"))
            if not path.stem.startswith("_")]


def render(page: str) -> str:
    """The markdown of reference page `page`."""
    title, packages = PAGES[page]
    lines = [
        f"# {title}",
        "",
        "<!-- Written by scripts/docs_reference.py from the package layout; edit that script, not this page. -->",
        "",
    ]
    for index, package in enumerate(packages):
        if index:
            lines += [f"## metagen.{package}", ""]
        # the package docstring as the page's (or the section's) introduction
        lines += [f"::: metagen.{package}", "    options:", "      show_root_heading: false",
                  "      members: false", ""]
        for module in public_modules(package):
            lines += [f"::: {module}", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for page in PAGES:
        path = REFERENCE / f"{page}.md"
        text = render(page)
        if path.exists() and path.read_text(encoding="utf-8") == text:
            continue
        if check:
            stale.append(str(path.relative_to(ROOT)))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    if stale:
        print("out of date (run: python scripts/docs_reference.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
