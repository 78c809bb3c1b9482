"""Look at the documentation site as a reader would: build it, serve it on 127.0.0.1 and take
screenshots of its main pages in headless Chromium, in light and in dark mode.

    python scripts/docs_screenshots.py --out out/docs-screenshots      (make docs-check)

Pages: the home page, a guide, an API reference page with formulas and a page with a figure.
Chromium is Debian's package (/usr/bin/chromium; `make docs-check` installs it when missing), run
headless with a fresh profile and its background networking off, so it needs no internet. The
dark pictures emulate `prefers-color-scheme: dark`, which the site's palette follows until the
reader picks one with the toggle. Each picture is taken after Chromium's virtual time has let
MathJax typeset the page. The pictures are not part of the repository (out/ is ignored).
"""

from __future__ import annotations

import argparse
import functools
import http.server
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# name -> page (its path in the site); --page adds others
PAGES = {
    "home": "",
    "guide": "guides/evaluation/",
    "api-formulas": "reference/theory/",
    "figure": "guides/theory/",
}
WIDTH, HEIGHT = 1280, 2000
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--hide-scrollbars", "--virtual-time-budget=15000",
]


def build(site: Path) -> None:
    """mkdocs build --strict into `site`."""
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(site)],
                   cwd=ROOT, check=True)


def serve(site: Path) -> tuple[http.server.ThreadingHTTPServer, int]:
    """A static file server for `site` on a free port of 127.0.0.1, in a daemon thread."""
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args) -> None:  # noqa: A002 - the base class's name
        pass


def screenshot(chromium: str, url: str, picture: Path, dark: bool, height: int = HEIGHT) -> None:
    """One PNG of `url`; a fresh profile per picture so nothing (such as the palette) carries over."""
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        flags = [*CHROMIUM_FLAGS, f"--window-size={WIDTH},{height}", f"--user-data-dir={profile}",
                 f"--screenshot={picture}"]
        if dark:
            flags.append("--force-dark-mode")  # prefers-color-scheme: dark
        done = subprocess.run([chromium, *flags, url], capture_output=True, text=True, timeout=180)
    if done.returncode != 0 or not picture.is_file():
        raise RuntimeError(f"chromium failed on {url} ({done.returncode}): {done.stderr.strip()[-2000:]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "docs-screenshots",
                        help="folder for the PNGs (default: out/docs-screenshots)")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium",
                        help="the Chromium binary (default: chromium on PATH)")
    parser.add_argument("--page", action="append", default=[], metavar="NAME=PATH",
                        help="also this page (PATH in the site, e.g. reference/sampling/); repeatable")
    parser.add_argument("--height", type=int, default=HEIGHT, help=f"window height in pixels (default {HEIGHT})")
    args = parser.parse_args(argv)
    pages = dict(PAGES)
    for item in args.page:
        name, separator, path = item.partition("=")
        if not separator or not name:
            parser.error(f"--page: {item!r} is not NAME=PATH")
        pages[name] = path
    if not Path(args.chromium).is_file():
        parser.error(f"--chromium: {args.chromium} does not exist (Debian: apt-get install -y chromium)")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="metagen-site-") as scratch:
        site = Path(scratch) / "site"
        build(site)
        server, port = serve(site)
        try:
            for name, page in pages.items():
                if not (site / page / "index.html").is_file():
                    raise FileNotFoundError(f"the site has no page {page or '/'} (PAGES in {__file__})")
                for mode in ("light", "dark"):
                    picture = args.out / f"{name}-{mode}.png"
                    screenshot(args.chromium, f"http://127.0.0.1:{port}/{page}", picture, dark=mode == "dark",
                               height=args.height)
                    print(picture)
        finally:
            server.shutdown()
            server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
