"""The models a running server holds: load, warm up, serve, reload and unload them, one state per model.

A model is ``LOADING`` → ``READY``, or ``UNAVAILABLE`` with the reason (failed to load, or unloaded). Loading
runs on a worker thread (building an ONNX Runtime session blocks), so the server keeps answering — and the other
models keep serving — while one loads or fails. Loading an already-loaded model is a reload: the new copy is
built and warmed beside the old one, then swapped in; requests already queued on the old copy finish there
(`Batcher.drain`), as they do on an unload.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deskpod.errors import DeskpodError, NotFoundError, UsageError
from deskpod.serve.batcher import Batcher, ModelUnavailable
from deskpod.serve.images import network_config
from deskpod.serve.metrics import ModelStats
from deskpod.serve.repository import ModelConfig, is_model_folder, model_names, read_config, versions_to_load
from deskpod.serve.runtimes import Runtime, example_inputs, instance_devices, load_runtime

log = logging.getLogger("deskpod.serve")


class ModelNotFound(NotFoundError):
    """An unknown model or version (HTTP 404)."""


@dataclass(slots=True)
class LoadedVersion:
    config: ModelConfig
    version: str
    batcher: Batcher
    stats: ModelStats


@dataclass(slots=True)
class ModelEntry:
    name: str
    state: str = "LOADING"  # LOADING | READY | UNAVAILABLE
    reason: str = ""
    versions: dict[str, LoadedVersion] = field(default_factory=dict)  # ascending version order

    @property
    def latest(self) -> LoadedVersion:
        return self.versions[max(self.versions, key=int)]


def _build(model_dir: Path) -> tuple[ModelConfig, dict[str, list[Runtime]]]:
    """Read the config, load every instance of every version, warm each up (worker thread)."""
    config = read_config(model_dir)
    devices = instance_devices(config)
    built: dict[str, list[Runtime]] = {}
    net = network_config(config)  # an image model's runtime takes the decoded tensor
    for v in versions_to_load(model_dir, config):
        instances = [load_runtime(model_dir / str(v), net, d) for d in devices]
        if config.warmup:
            sizes = sorted({1, max(1, config.max_batch_size)})
            for rt in instances:
                for b in sizes:
                    rt.run(example_inputs(net, b))
        built[str(v)] = instances
    return config, built


class ModelRegistry:
    def __init__(self, repo: Path) -> None:
        self.repo = repo
        self.models: dict[str, ModelEntry] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def load_all(self, names: list[str] | None = None) -> None:
        wanted = model_names(self.repo) if names is None else names
        await asyncio.gather(*(self.load(n, raise_errors=False) for n in wanted))

    async def load(self, name: str, raise_errors: bool = True) -> None:
        """Load (or reload) one model; a failure leaves it UNAVAILABLE with the reason, others unaffected."""
        model_dir = self.repo / name
        if "/" in name or name.startswith(".") or not is_model_folder(model_dir):
            raise ModelNotFound(f"no model {name!r} in repository {self.repo}; models: {model_names(self.repo)}")
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            entry = self.models.setdefault(name, ModelEntry(name))
            if entry.state != "READY":
                entry.state, entry.reason = "LOADING", ""
            try:
                config, built = await asyncio.get_running_loop().run_in_executor(None, _build, model_dir)
            except Exception as e:
                if entry.state != "READY":  # a failed reload keeps the copy that works
                    entry.state = "UNAVAILABLE"
                entry.reason = f"failed to load: {e}"
                log.error("model %s failed to load: %s", name, e)
                if raise_errors:
                    raise e if isinstance(e, DeskpodError) else UsageError(entry.reason) from e
                return
            old = entry.versions
            entry.versions = {}
            for v, instances in built.items():
                stats = ModelStats(name, v)
                batcher = Batcher(
                    instances,
                    max_batch_size=config.max_batch_size,
                    max_queue_delay_s=config.max_queue_delay_us / 1e6,
                    max_queue_size=config.max_queue_size,
                    stats=stats,
                    preferred_batch_sizes=config.preferred_batch_sizes,
                    merge=config.dynamic_batching,
                )
                batcher.start()
                entry.versions[v] = LoadedVersion(config, v, batcher, stats)
            entry.state, entry.reason = "READY", ""
            log.info("model %s ready (versions %s)", name, ", ".join(entry.versions))
            for lv in old.values():
                await lv.batcher.drain()

    async def unload(self, name: str) -> None:
        entry = self.models.get(name)
        if entry is None:
            raise ModelNotFound(f"model {name!r} is not loaded; loaded: {sorted(self.models)}")
        async with self._locks.setdefault(name, asyncio.Lock()):
            old, entry.versions = entry.versions, {}
            entry.state, entry.reason = "UNAVAILABLE", "unloaded"
            for lv in old.values():
                await lv.batcher.drain()

    def get(self, name: str, version: str | None = None) -> LoadedVersion:
        entry = self.models.get(name)
        if entry is None:
            raise ModelNotFound(f"unknown model {name!r}; models: {sorted(self.models)}")
        if entry.state != "READY":
            why = f": {entry.reason}" if entry.reason else ""
            raise ModelUnavailable(f"model {name!r} is {entry.state}{why}")
        if version is None or version == "":
            return entry.latest
        lv = entry.versions.get(version)
        if lv is None:
            raise ModelNotFound(
                f"model {name!r} has no version {version!r}; loaded versions: {sorted(entry.versions, key=int)}"
            )
        return lv

    def index(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        known = set(self.models)
        with contextlib.suppress(DeskpodError):
            known |= set(model_names(self.repo))
        for name in sorted(known):
            entry = self.models.get(name)
            if entry is None:
                rows.append({"name": name, "state": "UNAVAILABLE", "reason": "not loaded"})
            elif entry.versions:
                rows.extend(
                    {"name": name, "version": v, "state": entry.state, "reason": entry.reason} for v in entry.versions
                )
            else:
                rows.append({"name": name, "state": entry.state, "reason": entry.reason})
        return rows

    def all_stats(self) -> list[ModelStats]:
        return [lv.stats for e in self.models.values() for lv in e.versions.values()]

    async def close(self) -> None:
        for name, entry in list(self.models.items()):
            if entry.versions:
                await self.unload(name)
