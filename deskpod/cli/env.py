"""``deskpod env``: the cache of per-job environments (deskpod/envs/cache.py).

deskpod env list [--json]                      every environment: key, account, state, Python, size, last use
deskpod env show KEY [--account NAME]          one (a key prefix is enough): meta, definition, freeze.txt
deskpod env remove KEY [--account NAME]        delete one (never while a job runs in it)
deskpod env prune [--max-size 20G] [--dry-run] remove broken ones, then least recently used, to the size
deskpod env build job.toml [--log FILE]        build (or find) the environment of a spec's [environment];
deskpod env build --definition env.json        ... or of a definition (the stored JSON form); prints its path

``--cache DIR`` picks the cache (default ``$DESKPOD_ENV_CACHE``, else ``$DESKPOD_HOME/envs``). On a pod started
by root each OS account's environments are a cache of their own under ``DIR/users/<account>``; ``list``, ``show``,
``remove`` and ``prune`` on the pod's cache cover them all, and say whose each one is (the ACCOUNT column; the
pod's own account for the top-level ones). ``env build`` is what the pod service runs, as the job's account and
inside its sandbox, as the first step of a job whose environment is not ready: ``--cache`` is that account's
cache, ``--python`` the interpreter the pod resolved (so that both compute the same key), the installer's output
goes to ``--log`` (default stderr), the environment's path to stdout, and a failed build exits 1 with one line on
stderr naming the installer's cause.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from deskpod.envs.cache import EnvCache, EnvEntry
    from deskpod.envs.python import Interpreter


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("env", help="the cache of per-job software environments: list, show, remove, prune, build")
    env = p.add_subparsers(dest="env_command", metavar="WHAT", required=True)

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        q: argparse.ArgumentParser = env.add_parser(name, help=help_text)
        q.add_argument("--cache", type=Path, metavar="DIR", help="the cache (default $DESKPOD_ENV_CACHE or "
                       "$DESKPOD_HOME/envs)")  # fmt: skip
        q.add_argument("--json", action="store_true", help="print JSON instead of text")
        return q

    add("list", "every environment in the cache, least recently used first").set_defaults(func=run_list)
    for name, help_text, func in (
        ("show", "one environment: what defines it, how it was built, its exact packages", run_show),
        ("remove", "delete one environment (never one a job is running in)", run_remove),
    ):
        s = add(name, help_text)
        s.add_argument("key", metavar="KEY", help="its key, or the first characters of it")
        s.add_argument("--account", metavar="NAME", help="the OS account whose environment it is, when two have"
                       " it ('' for the pod's own)")  # fmt: skip
        s.set_defaults(func=func)
    r = add("prune", "remove broken environments, then the least recently used, down to a size")
    r.add_argument("--max-size", default="20G", metavar="SIZE", help="what the cache may keep, e.g. 500M, 20G "
                   "(default 20G; uv's own cache not counted)")  # fmt: skip
    r.add_argument("--dry-run", action="store_true", help="say what would be removed, remove nothing")
    r.set_defaults(func=run_prune)
    b = add("build", "build (or find) an environment and print its path")
    b.add_argument("spec", nargs="?", type=Path, metavar="SPEC", help="a job spec (.toml or .json) with [environment]")
    b.add_argument("--definition", type=Path, metavar="FILE", help="a definition as JSON (what the pod stores)")
    b.add_argument("--log", type=Path, metavar="FILE", help="append the installer's output here (default stderr)")
    b.add_argument("--python", type=Path, metavar="PATH", help="build on this interpreter (default: the newest"
                   " one here of the version the definition asks for)")  # fmt: skip
    b.set_defaults(func=run_build)


def _cache(args: argparse.Namespace) -> EnvCache:
    from deskpod.envs.cache import EnvCache

    return EnvCache(args.cache)


def _when(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


def _totals(cache: EnvCache) -> dict[str, Any]:
    return {"total_bytes": cache.total_bytes(), "uv_cache_bytes": cache.uv_cache_bytes(), "root": str(cache.root)}


def _whose(cache: EnvCache, entry: EnvEntry) -> str:
    """The account an entry belongs to: its tree's, or for the cache's own root, the account that owns it."""
    if entry.account:
        return entry.account
    import pwd

    owner = cache.owner
    try:
        return pwd.getpwuid(owner).pw_name if owner is not None else "-"
    except KeyError:
        return str(owner)


def run_list(args: argparse.Namespace) -> int:
    from deskpod.envs.cache import format_size

    cache = _cache(args)
    entries = cache.entries()
    totals = _totals(cache)
    if args.json:
        print(json.dumps({"environments": [e.to_json() for e in entries], **totals}, indent=2))
        return 0
    if not entries:
        print(f"no environments in {cache.root}")
    else:
        whose = [_whose(cache, e) for e in entries]
        width = max(7, *(len(w) for w in whose))
        print(f"{'KEY':<12}  {'ACCOUNT':<{width}}  {'STATE':<8}  {'PYTHON':<8}  {'SIZE':>6}  {'LAST USED':<16}  WHAT")
        for e, w in zip(entries, whose, strict=True):
            state = e.state + ("*" if e.in_use and e.state == "ready" else "")
            print(f"{e.key[:12]:<12}  {w:<{width}}  {state:<8}  {e.python:<8}  {format_size(e.size_bytes):>6}  "
                  f"{_when(e.last_used or e.created):<16}  {e.summary}")  # fmt: skip
        if any(e.in_use and e.state == "ready" for e in entries):
            print("(* in use by a running job)")
    print(f"total: {len(entries)} environment{'s' * (len(entries) != 1)}, {format_size(totals['total_bytes'])}"
          f" (uv cache {format_size(totals['uv_cache_bytes'])}, shared with them by hardlinks) in {cache.root}")  # fmt: skip
    return 0


def run_show(args: argparse.Namespace) -> int:
    from deskpod.envs.cache import format_size

    cache = _cache(args)
    entry = cache.find(args.key, args.account)
    tree = cache.tree(entry.account)  # read as `deskpod.envs.userfiles` does: the account's files, no link followed
    meta = _json(tree.read(entry.key, "meta.json")) or _json(tree.read(entry.key, "definition.json")) or {}
    raw = tree.read(entry.key, "freeze.txt")
    freeze = raw.decode(errors="replace") if raw is not None else None
    if args.json:
        print(json.dumps({**entry.to_json(), "meta": meta, "freeze": freeze}, indent=2))
        return 0
    python = meta.get("python")
    python = python if isinstance(python, dict) else {}
    print(f"key:        {entry.key}")
    print(f"account:    {_whose(cache, entry)}")
    print(f"state:      {entry.state}{' (in use)' if entry.in_use else ''}")
    print(f"what:       {entry.summary}")
    print(f"python:     {python.get('version', '?')} ({python.get('implementation', '?')}, {python.get('platform', '?')})"
          f" from {python.get('path', '?')}")  # fmt: skip
    print(f"installer:  {meta.get('installer', '?')}")
    print(f"created:    {_when(entry.created)}" + (f", built in {meta['built_s']:.1f} s" if "built_s" in meta else ""))
    print(f"last used:  {_when(entry.last_used)}")
    print(f"size:       {format_size(entry.size_bytes)}")
    print(f"path:       {entry.folder / 'env'}")
    print(f"build log:  {entry.folder / 'build.log'}")
    print("definition:")
    for line in json.dumps(meta.get("definition"), indent=2).splitlines():
        print("  " + line)
    if freeze is not None:
        print("freeze.txt:")
        for line in freeze.splitlines():
            print("  " + line)
    elif entry.state == "broken":
        print("freeze.txt: none (the build did not finish; see the build log)")
    return 0


def _json(raw: bytes | None) -> dict[str, Any] | None:
    try:
        data = json.loads(raw) if raw is not None else None
    except (ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def run_remove(args: argparse.Namespace) -> int:
    from deskpod.envs.cache import format_size

    cache = _cache(args)
    e = cache.remove(args.key, args.account)
    if args.json:
        print(json.dumps({"removed": e.to_json()}, indent=2))
    else:
        print(f"removed {e.key[:12]}  {_whose(cache, e)}  {e.state}  {format_size(e.size_bytes)}  {e.summary}")
    return 0


def run_prune(args: argparse.Namespace) -> int:
    from deskpod.environment.sizes import parse_size
    from deskpod.envs.cache import format_size

    limit = parse_size(args.max_size, "--max-size")
    cache = _cache(args)
    removed = cache.prune(limit, dry_run=args.dry_run)
    left: list[EnvEntry] = cache.entries()
    if args.dry_run:
        gone = {e.folder for e in removed}
        left = [e for e in left if e.folder not in gone]
    total = cache.total_bytes(exclude={e.folder for e in removed})
    if args.json:
        print(json.dumps({"dry_run": args.dry_run, "max_bytes": limit, "removed": [e.to_json() for e in removed],
                          "left": [e.to_json() for e in left], **_totals(cache), "total_bytes": total},
                         indent=2))  # fmt: skip
        return 0
    verb = "would remove" if args.dry_run else "removed"
    for e in removed:
        print(f"{verb} {e.key[:12]}  {_whose(cache, e)}  {e.state:<8}  {format_size(e.size_bytes):>6}  last used"
              f" {_when(e.last_used)}  {e.summary}")  # fmt: skip
    if not removed:
        print(f"nothing to remove: the cache is within {format_size(limit)}")
    in_use = sum(1 for e in left if e.in_use)
    print(f"left: {len(left)} environment{'s' * (len(left) != 1)}, {format_size(total)} of at most"
          f" {format_size(limit)}" + (f" ({in_use} in use, never removed)" if in_use else "")
          + f"; uv cache {format_size(cache.uv_cache_bytes())}")  # fmt: skip
    return 0


def run_build(args: argparse.Namespace) -> int:
    import sys

    from deskpod.envs.definition import parse_environment
    from deskpod.errors import ConfigError, UsageError

    if (args.spec is None) == (args.definition is None):
        raise UsageError("give a job spec (SPEC.toml) or --definition FILE.json to build, one of them")
    if args.spec is not None:
        from deskpod.jobs.spec import load_spec_file

        data = load_spec_file(args.spec)
        if "environment" not in data:
            raise ConfigError(f"job spec {str(args.spec)!r} has no [environment] table; add one, e.g."
                              ' [environment] packages = ["six==1.17.0"]')  # fmt: skip
        table, base = data["environment"], args.spec.resolve().parent
    else:
        try:
            table = json.loads(args.definition.read_text())
        except OSError as e:
            raise ConfigError(f"--definition {str(args.definition)!r}: cannot read it ({e.strerror})") from e
        except ValueError as e:
            raise ConfigError(f"--definition {str(args.definition)!r}: not valid JSON: {e}") from e
        base = args.definition.resolve().parent
    defn = parse_environment(table, base_dir=base)
    if defn.kind == "image":
        from deskpod.envs.images import check_image

        runtime = check_image(defn)
        raise UsageError(f"job spec: environment.image {defn.image!r} is run by {runtime} when the job starts; there is"
                         " nothing to build")  # fmt: skip
    interp = _interpreter(args.python, defn.python) if args.python is not None else None
    cache = _cache(args)
    if args.log is not None:
        try:
            log = open(args.log, "ab")  # noqa: SIM115 (closed below; opening is where a bad path is named)
        except OSError as e:
            raise UsageError(f"--log {str(args.log)!r}: cannot open it ({e.strerror})") from e
        with log:
            built = cache.ensure(defn, log=log, interp=interp)
    else:
        built = cache.ensure(defn, log=sys.stderr.buffer, interp=interp)
    print(json.dumps(built.to_json(), indent=2) if args.json else built.path)
    return 0


def _interpreter(path: Path, wanted: str | None) -> Interpreter:
    """The interpreter at ``path``, run once; `UsageError` when it does not run or is not the version asked for."""
    from deskpod.envs.python import probe
    from deskpod.errors import UsageError

    found = probe([path])
    if not found:
        raise UsageError(f"--python {str(path)!r}: not a Python interpreter that runs here")
    interp = found[0]
    if wanted is not None and wanted not in (interp.version, interp.minor):
        raise UsageError(f"--python {str(path)!r} is Python {interp.version}; the environment asks for {wanted}")
    return interp
