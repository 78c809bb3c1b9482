"""mkdocs hook (mkdocs.yml `hooks:`): MathJax 3 served from the built site, so math renders offline.

The pages' LaTeX ($...$, $$...$$, and the API reference's docstrings) is marked by
pymdownx.arithmatex and typeset in the browser by MathJax. A CDN copy would not load where the
site is read without internet (a laptop on a train, a closed network), so the build copies
MathJax's own files into `site/javascripts/mathjax/`.

Where they come from: the `mathjax` package of the npm registry at a pinned version, fetched once
with npm (`npm pack`), checked against its pinned sha512 and unpacked into
`build/docs-vendor/mathjax-<version>/` (not committed; `make clean` removes it). Later builds reuse
it. Only the parts a page can load are copied (about 6 MB): the TeX+MathML→HTML bundle, its fonts,
the TeX extensions it loads on demand and the menu / accessibility components.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

log = logging.getLogger("mkdocs.hooks.mathjax")

VERSION = "3.2.2"
# `npm view mathjax@3.2.2 dist.integrity`
INTEGRITY = "sha512-Bt+SSVU8eBG27zChVewOicYs7Xsdt40qm4+UpHyX7k0/O9NliPc+x77k1/FEsPsjKPZGJvtRZM1vO+geW0OhGw=="
ROOT = Path(__file__).resolve().parents[1]
VENDOR = ROOT / "build" / "docs-vendor" / f"mathjax-{VERSION}"
# what the site needs, relative to the package's es5/ folder
PARTS = ("tex-mml-chtml.js", "output/chtml/fonts/woff-v2", "input/tex/extensions", "input/mml", "ui", "a11y", "sre")
TARGET = "javascripts/mathjax"


def _integrity(path: Path) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(path.read_bytes()).digest()).decode()


def fetch(vendor: Path = VENDOR) -> Path:
    """The unpacked es5/ folder of mathjax@VERSION, fetched with npm on first use."""
    es5 = vendor / "es5"
    if (es5 / PARTS[0]).is_file():
        return es5
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError(f"the docs need MathJax {VERSION} from the npm registry and npm is not installed "
                           "(Debian: apt-get install -y npm)")
    vendor.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=vendor.parent) as scratch:
        log.info("fetching mathjax@%s with npm", VERSION)
        done = subprocess.run([npm, "pack", f"mathjax@{VERSION}", "--pack-destination", scratch, "--silent"],
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"npm pack mathjax@{VERSION} failed ({done.returncode}): {done.stderr.strip()}")
        tarball = Path(scratch) / f"mathjax-{VERSION}.tgz"
        found = _integrity(tarball)
        if found != INTEGRITY:
            raise RuntimeError(f"mathjax-{VERSION}.tgz has integrity {found}, expected {INTEGRITY}")
        unpacked = Path(scratch) / "unpacked"
        with tarfile.open(tarball) as archive:
            members = [member for member in archive.getmembers() if member.name.startswith("package/es5/")]
            # the "data" filter (no links out of the folder, no special files) where Python has it
            safety = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            archive.extractall(unpacked, members=members, **safety)
        if vendor.exists():
            shutil.rmtree(vendor)
        (unpacked / "package").rename(vendor)  # atomic within one file system
    return es5


def on_config(config):
    fetch()  # fail early, before the pages are built
    return config


def on_post_build(config) -> None:
    es5 = fetch()
    target = Path(config["site_dir"]) / TARGET
    for part in PARTS:
        source, destination = es5 / part, target / part
        if source.is_dir():
            shutil.copytree(source, destination, dirs_exist_ok=True)
        else:
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination)
