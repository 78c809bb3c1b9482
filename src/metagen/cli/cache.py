"""`metagen cache`: what the on-disk cache holds ($METAGEN_CACHE: converted weights, compiled
kernels, retrieval indexes), and pruning or clearing it by hand.

    metagen cache list [--json]          each entry, least recently used first, and the total
    metagen cache prune [--limit SIZE]   evict least recently used entries down to SIZE
    metagen cache clear [--kind KIND]    remove every entry (of KIND)

The cache also prunes itself to $METAGEN_CACHE_LIMIT (default 20 GB) after each new entry.
Entries another process is writing are skipped; downloaded data sets are not touched.
"""

from __future__ import annotations

import argparse
import json


def add_parser(commands) -> None:
    from metagen.models.disk_cache import DEFAULT_LIMIT, KINDS

    cache = commands.add_parser("cache", help="list, prune or clear the on-disk cache (weights, kernels, indexes)")
    actions = cache.add_subparsers(dest="action", metavar="{list,prune,clear}")
    listing = actions.add_parser("list", help="each entry, least recently used first, and the total")
    listing.add_argument("--json", action="store_true", help="print one JSON object")
    prune = actions.add_parser("prune", help="evict least recently used entries down to a size")
    prune.add_argument("--limit", default=None, metavar="SIZE",
                       help=f"keep at most SIZE, e.g. 5GB or 512MiB (default $METAGEN_CACHE_LIMIT or {DEFAULT_LIMIT})")
    clear = actions.add_parser("clear", help="remove every entry (converted again, built again when next needed)")
    clear.add_argument("--kind", choices=sorted(KINDS), default=None, help="only entries of this kind")
    cache.set_defaults(run=run, action="list", json=False)


def _entries(count: int) -> str:
    return f"{count} {'entry' if count == 1 else 'entries'}"


def run(args: argparse.Namespace) -> int:
    from metagen.models import disk_cache
    from metagen.sizes import format_size, parse_size

    root = disk_cache.cache_directory()
    if args.action == "list":
        entries = disk_cache.cache_entries()
        total = sum(entry.size for entry in entries)
        limit = disk_cache.cache_limit()
        if args.json:
            print(json.dumps({"directory": str(root), "size": total, "limit": limit,
                              "entries": [entry.row() for entry in entries]}, indent=1))
            return 0
        for entry in entries:
            row = entry.row()
            print(f"{row['kind']:<9} {row['size_text']:>9}  {row['last_used']}  {entry.path.name}  {row['source']}")
        bound = format_size(limit) if limit else "no limit"
        print(f"{_entries(len(entries))}, {format_size(total)} in {root} (limit {bound}, METAGEN_CACHE_LIMIT)")
        return 0
    if args.action == "prune":
        limit = disk_cache.cache_limit() if args.limit is None else parse_size(args.limit, "--limit")
        if limit <= 0:
            raise ValueError(f"--limit {args.limit!r}: give a size above 0 to prune to (clear removes everything)")
        removed = disk_cache.prune(limit, idle_seconds=0.0)
        left = sum(entry.size for entry in disk_cache.cache_entries())
        print(f"removed {_entries(len(removed))} ({format_size(sum(entry.size for entry in removed))}); "
              f"{format_size(left)} left in {root}")
        return 0
    kinds = tuple(disk_cache.KINDS) if args.kind is None else (args.kind,)
    entries = disk_cache.cache_entries(kinds=kinds)
    removed = [entry for entry in entries if disk_cache.remove_entry(entry.path)]
    busy = len(entries) - len(removed)
    print(f"removed {_entries(len(removed))} ({format_size(sum(entry.size for entry in removed))}) from {root}"
          + (f"; {busy} in use by another process were kept" if busy else ""))
    return 0
