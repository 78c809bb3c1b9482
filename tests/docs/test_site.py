"""The documentation site builds strictly (a broken link, a missing page or an API reference that
does not resolve fails), its reference covers every public module, and its math is served offline."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_site_builds_strictly(tmp_path: Path) -> None:
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    # MathJax is part of the site (pages are read offline), and the pages load it from there;
    # no page loads a script, a stylesheet or a font from another host
    assert (site / "javascripts" / "mathjax" / "tex-mml-chtml.js").is_file()
    assert (site / "javascripts" / "mathjax" / "output" / "chtml" / "fonts" / "woff-v2").is_dir()
    home = (site / "index.html").read_text(encoding="utf-8")
    assert "javascripts/mathjax/tex-mml-chtml.js" in home
    outside = re.compile(r"<(?:link|script)\b[^>]*\b(?:href|src)=\"(?:https?:)?//")
    assert not [page for page in site.rglob("*.html") if outside.search(page.read_text(encoding="utf-8"))]
    # the API reference is generated from the docstrings, with the math marked for MathJax
    theory = (site / "reference" / "theory" / "index.html").read_text(encoding="utf-8")
    assert "metagen.theory.best_of_n.bon_pmf" in theory
    assert 'class="arithmatex"' in theory


def test_reference_covers_every_public_module() -> None:
    reference = _script("docs_reference")
    stale = [page for page in reference.PAGES
             if not (ROOT / "docs" / "reference" / f"{page}.md").is_file()
             or (ROOT / "docs" / "reference" / f"{page}.md").read_text(encoding="utf-8") != reference.render(page)]
    assert not stale, f"reference pages out of date, run: python scripts/docs_reference.py ({stale})"
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert all(f"reference/{page}.md" in nav for page in reference.PAGES)
    # every package of src/metagen is on a reference page, except the command line (its own page)
    packages = {path.parent.relative_to(ROOT / "src" / "metagen").as_posix().replace("/", ".")
                for path in (ROOT / "src" / "metagen").rglob("__init__.py")} - {"."}
    shown = {package for _, listed in reference.PAGES.values() for package in listed}
    assert packages - shown == {"cli"}


def test_prose_docstrings_keep_their_notation() -> None:
    escape = _script("griffe_prose").escape_prose
    text = "U[i][j] = u(c[i], c[j]); accept with min(1, q[i](x)/p[i](x)); a `q[i](x)` span; <key>; $q[i]$"
    assert escape(text) == ("U&#91;i]&#91;j] = u(c&#91;i], c&#91;j]); accept with min(1, q&#91;i](x)/p&#91;i](x)); "
                            "a `q[i](x)` span; &lt;key>; $q[i]$")
    # indented and fenced blocks are code: left as written; a markdown link stays a link
    assert escape("text\n\n    q[i](x) <b>\n\nsee [top_p](top_p.md)") == (
        "text\n\n    q[i](x) <b>\n\nsee [top_p](top_p.md)")
    assert escape("```\nq[i](x)\n```") == "```\nq[i](x)\n```"
