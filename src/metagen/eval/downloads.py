"""Published evaluation data, fetched once from its canonical source into a cache and checked.

    path = data_file(SOURCES["gsm8k"])            # the cached file, downloaded on first use
    path = data_file(SOURCES["gsm8k"], "my.jsonl")  # a copy the user has (offline use)

A `DataSource` names a file by its canonical URL (pinned to a commit, so its bytes cannot
change), the name it is cached under and its SHA-256. The cache is `$METAGEN_DATA`, default
`$METAGEN_CACHE/data` (`~/.cache/metagen/data`, beside the converted weights and kernels of
`models/disk_cache`). Where the file comes from, in order:

  1. a path the caller gives (`--data PATH`): read as it is; a SHA-256 other than the published
     file's is said on stderr (the scores are then not those of the published benchmark), not
     refused, as it may be a user's deliberate subset or fix;
  2. the cached file, when its SHA-256 matches (one read of the file: ~3 ms for GSM8K's 750 kB);
  3. a download (`download`, HTTPS with a timeout), written to a private temporary name, checked,
     then renamed into place, so a reader never sees a partial or unchecked file; a cached file
     that fails its check is replaced so.

A download that fails (no network) raises `DataUnavailableError`, which names the URL, the
cache path to put the file at and the `--data` option. A source whose checksum could not be
pinned (`sha256` None) is checked by its loader's own count of records instead.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path

TIMEOUT_SECONDS = 60.0
MAX_BYTES = 64 << 20  # no published task file here is near this: a larger answer is not the file


@dataclass(frozen=True)
class DataSource:
    """name: the task's name; url: the canonical file (pinned to a commit); filename: its name in
    the cache; sha256: the file's SHA-256 (lower-case hex), None when not pinned; licence: its
    licence and owner, shown where the file is named."""

    name: str
    url: str
    filename: str
    sha256: str | None
    licence: str


SOURCES = {
    "gsm8k": DataSource(
        "gsm8k",
        "https://raw.githubusercontent.com/openai/grade-school-math/3101c7d5072418e28b9008a6636bde82a006892c/"
        "grade_school_math/data/test.jsonl",
        "gsm8k-test.jsonl",
        "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14",
        "MIT, OpenAI (openai/grade-school-math)"),
    "mbpp": DataSource(
        "mbpp",
        "https://raw.githubusercontent.com/google-research/google-research/2251e8c67a7fe7d6348714967ee101080b28e956/"
        "mbpp/mbpp.jsonl",
        "mbpp.jsonl",
        None,
        "CC-BY 4.0, Google (google-research/google-research, mbpp/)"),
    # MATH-500 (Lightman et al. 2023): the 500 MATH test problems PRM800K holds out, stored with
    # Git LFS, so the file is served from GitHub's media host; its SHA-256 is the LFS object id.
    "math500": DataSource(
        "math500",
        "https://media.githubusercontent.com/media/openai/prm800k/7ecc794703b2877f63226f2477a49b34f9b25163/"
        "prm800k/math_splits/test.jsonl",
        "math500-test.jsonl",
        "35dc41080a3680858b27fa7e0533d2d547825316fc5dafe5d316f4ccc5a06132",
        "MIT, OpenAI (openai/prm800k); the problems are MATH's (Hendrycks et al. 2021, MIT)"),
}


class DataUnavailableError(FileNotFoundError):
    """The data file is neither given, cached nor downloadable; the message says where to put it."""


def data_directory() -> Path:
    """$METAGEN_DATA, default $METAGEN_CACHE/data (~/.cache/metagen/data)."""
    explicit = os.environ.get("METAGEN_DATA")
    if explicit:
        return Path(explicit)
    from metagen.models.disk_cache import cache_directory

    return cache_directory() / "data"


def sha256_of(path: Path) -> str:
    """SHA-256 of a file's bytes (lower-case hex), read in 1 MiB chunks: O(size)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def download(url: str) -> bytes:
    """The bytes at `url` (HTTPS GET, TIMEOUT_SECONDS, at most MAX_BYTES); OSError on failure.
    The one network call of this module (tests replace it)."""
    from urllib.request import Request, urlopen

    request = Request(url, headers={"User-Agent": "metagen"})
    with urlopen(request, timeout=TIMEOUT_SECONDS) as response:  # noqa: S310 (a fixed https URL)
        body = response.read(MAX_BYTES + 1)
    if len(body) > MAX_BYTES:
        raise OSError(f"{url} sent more than {MAX_BYTES} bytes")
    return body


def data_file(source: DataSource, path: str | Path | None = None) -> Path:
    """The local file of `source` (see the module docstring for the order: `path`, the cache, a
    download). FileNotFoundError when `path` does not exist; DataUnavailableError when nothing
    is cached and the download fails; ValueError when a download's SHA-256 is not the
    published file's (the file is not kept)."""
    if path is not None:
        given = Path(path)
        if not given.is_file():
            raise FileNotFoundError(f"--data {given}: no such file (the {source.name} data: {source.url})")
        if source.sha256 is not None and sha256_of(given) != source.sha256:
            print(f"metagen: {given} is not the published {source.name} file (its SHA-256 differs from "
                  f"{source.sha256[:16]}...): scores on it are not comparable with published ones", file=sys.stderr)
        return given
    cached = data_directory() / source.filename
    if cached.is_file() and (source.sha256 is None or sha256_of(cached) == source.sha256):
        return cached
    try:
        body = download(source.url)
    except OSError as error:
        reason = getattr(error, "reason", None) or error
        raise DataUnavailableError(
            f"the {source.name} data is not cached at {cached} and could not be downloaded from {source.url} "
            f"({reason}). Put that file at {cached} (or set METAGEN_DATA to the folder holding "
            f"{source.filename}), or pass --data PATH to a copy; licence: {source.licence}") from None
    actual = hashlib.sha256(body).hexdigest()
    if source.sha256 is not None and actual != source.sha256:
        raise ValueError(f"the file downloaded from {source.url} has SHA-256 {actual}, not the published "
                         f"{source.name} file's {source.sha256}: not kept (a changed or truncated download)")
    cached.parent.mkdir(parents=True, exist_ok=True)
    staging = cached.with_name(f"{cached.name}.partial-{secrets.token_hex(4)}")
    try:
        staging.write_bytes(body)
        os.replace(staging, cached)  # atomic: readers see the old file, or the whole checked one
    finally:
        staging.unlink(missing_ok=True)
    return cached
