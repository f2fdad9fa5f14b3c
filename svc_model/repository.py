"""Which versions of which models are loaded, and which one serves.

Pure bookkeeping, run on the server's event loop (no locks needed): the
registry hands in loaded versions, the inference core asks for the version a
request names. Replacing the champion is one assignment: a request that
already holds a version finishes on it, whatever is promoted meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.contracts.aistack.v1 import models_pb2
from shared.errors import NotFound
from shared.model_registry import challengers, serving
from shared.objective import version_number
from shared.settings import ServingPolicy

READY = "READY"
UNAVAILABLE = "UNAVAILABLE"
UNLOADED = "UNLOADED"


@dataclass(eq=False)
class Served:
    """One loaded version. ``executor`` runs it (a batcher or a plain runner)."""

    name: str
    version: int
    event: models_pb2.ModelReady
    executor: Any


@dataclass(frozen=True)
class IndexEntry:
    name: str
    version: str
    state: str
    reason: str = ""


@dataclass(frozen=True)
class Change:
    promoted: bool
    evicted: tuple[Served, ...] = ()


@dataclass
class _Model:
    loaded: dict[int, Served] = field(default_factory=dict)
    champion: Served | None = None
    # Every event seen, loaded or not: what a RepositoryModelLoad reloads from.
    known: dict[int, models_pb2.ModelReady] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)
    unloaded: bool = False
    # The loaded challengers, newest first: worked out when the versions
    # change, not per request.
    shadows: list[Served] = field(default_factory=list)


def wanted(
    events: Iterable[models_pb2.ModelReady], policy: ServingPolicy, keep: int, shadows: int = 0
) -> list[int]:
    """Which versions of one model to load, from all its events: the champion
    the rule picks over them, the ``keep`` newest, and its challengers (at
    most ``shadows``)."""
    ordered = sorted(events, key=lambda e: version_number(e.version))
    best = serving(ordered, policy)
    if best is None:
        return []
    newest = [version_number(e.version) for e in ordered[-keep:]]
    challenging = [version_number(e.version) for e in challengers(ordered, policy, shadows)]
    return sorted({version_number(best.version), *newest, *challenging})


class Repository:
    def __init__(self, policy: ServingPolicy, keep_versions: int, challengers: int = 0) -> None:
        self.policy = policy
        self.keep = keep_versions
        self.shadows = challengers
        self._models: dict[str, _Model] = {}

    # ---- what the registry feeds in ----

    def know(self, event: models_pb2.ModelReady) -> bool:
        """Take a version's event; returns whether the champion changed (a
        loaded version's event again with a live decision's labels)."""
        model = self._models.setdefault(event.model_name, _Model())
        number = version_number(event.version)
        model.known[number] = event
        previous = model.champion
        if number in model.loaded:
            # The same bytes, newer facts (a challenger's mark, a decision):
            # the event serves as is, and the rule is asked again.
            model.loaded[number].event = event
            model.champion = self._champion_of(model)
        self._refresh(model)
        return model.champion is not previous

    def known(self, name: str) -> list[models_pb2.ModelReady]:
        model = self._models.get(name)
        return [] if model is None else [model.known[v] for v in sorted(model.known)]

    def wanted(self, name: str) -> list[models_pb2.ModelReady]:
        model = self._models.get(name)
        if model is None:
            return []
        versions = wanted(model.known.values(), self.policy, self.keep, self.shadows)
        return [model.known[v] for v in versions]

    def install(self, served: Served) -> Change:
        """Add a loaded version; promote it if the policy says so; evict
        versions beyond the newest ``keep`` (never the champion nor a challenger)."""
        model = self._models.setdefault(served.name, _Model())
        model.known.setdefault(served.version, served.event)
        model.failed.pop(served.version, None)
        model.loaded[served.version] = served
        previous = model.champion
        model.champion = self._champion_of(model)
        promoted = model.champion is not previous
        keep = set(sorted(model.loaded)[-self.keep :])
        if model.champion is not None:
            keep.add(model.champion.version)
        keep.update(self._challenging(model))
        evicted = tuple(model.loaded.pop(v) for v in sorted(model.loaded) if v not in keep)
        self._refresh(model)
        return Change(promoted=promoted, evicted=evicted)

    def _champion_of(self, model: _Model) -> Served:
        """The rule's pick over every version seen (not only those loaded: a
        re-tune's versions are judged against the baseline they name even
        after it is evicted), once that pick is loaded; until then the
        champion stays. A version that failed to load is never picked."""
        usable = [event for version, event in model.known.items() if version not in model.failed]
        pick = serving(usable, self.policy)
        if pick is not None and version_number(pick.version) in model.loaded:
            return model.loaded[version_number(pick.version)]
        if model.champion is not None and model.champion.version in model.loaded:
            return model.champion
        top = serving((s.event for s in model.loaded.values()), self.policy)
        assert top is not None  # the version just installed is loaded
        return model.loaded[version_number(top.version)]

    def failed(self, name: str, version: str, reason: str) -> None:
        model = self._models.setdefault(name, _Model())
        model.failed[version_number(version)] = reason
        self._refresh(model)

    def unload(self, name: str) -> tuple[Served, ...]:
        """Stop serving ``name``; returns what was loaded (for the caller to release)."""
        model = self._model(name)
        dropped = tuple(model.loaded.values())
        model.loaded.clear()
        model.champion = None
        model.unloaded = True
        self._refresh(model)
        return dropped

    def is_unloaded(self, name: str) -> bool:
        model = self._models.get(name)
        return model is not None and model.unloaded

    def reloading(self, name: str) -> None:
        self._model(name).unloaded = False

    # ---- what requests ask ----

    def resolve(self, name: str, version: str = "") -> Served:
        """The version a request names, or the champion when it names none.
        Raises NotFound (unknown model, unloaded, version not loaded)."""
        model = self._models.get(name)
        if model is None or (not model.loaded and not model.known):
            raise NotFound(f"unknown model {name!r}")
        if model.unloaded:
            raise NotFound(f"model {name!r} is unloaded")
        if not version:
            if model.champion is None:
                raise NotFound(f"model {name!r} has no version ready")
            return model.champion
        number = version_number(version)
        served = model.loaded.get(number)
        if served is None:
            loaded = ", ".join(str(v) for v in sorted(model.loaded)) or "none"
            raise NotFound(f"model {name!r} has no version {version} loaded (loaded: {loaded})")
        return served

    def names(self) -> list[str]:
        return sorted(self._models)

    def knows(self, name: str) -> bool:
        """Whether ``name`` is a model of the repository (``name in names()``, per request)."""
        return name in self._models

    def loaded_versions(self, name: str) -> list[int]:
        model = self._models.get(name)
        return [] if model is None else sorted(model.loaded)

    def champion(self, name: str) -> Served | None:
        model = self._models.get(name)
        return None if model is None else model.champion

    def challengers(self, name: str) -> list[Served]:
        """The loaded challengers of ``name`` (``shared.model_registry.challengers``),
        newest first: what runs in its champion's shadow."""
        model = self._models.get(name)
        return [] if model is None else model.shadows

    def _refresh(self, model: _Model) -> None:
        if model.unloaded or model.champion is None:
            model.shadows = []
            return
        serving_now = model.champion.version
        model.shadows = [
            model.loaded[v]
            for v in self._challenging(model)
            if v in model.loaded and v != serving_now
        ]

    def _challenging(self, model: _Model) -> list[int]:
        usable = [event for version, event in model.known.items() if version not in model.failed]
        return [version_number(e.version) for e in challengers(usable, self.policy, self.shadows)]

    def index(self, ready_only: bool = False) -> list[IndexEntry]:
        entries: list[IndexEntry] = []
        for name in sorted(self._models):
            model = self._models[name]
            versions: Sequence[int] = sorted({*model.known, *model.loaded})
            for version in versions:
                if version in model.loaded:
                    entry = IndexEntry(name, str(version), READY)
                elif model.unloaded:
                    entry = IndexEntry(name, str(version), UNLOADED)
                elif version in model.failed:
                    entry = IndexEntry(name, str(version), UNAVAILABLE, model.failed[version])
                else:
                    entry = IndexEntry(name, str(version), UNAVAILABLE, "not loaded")
                if entry.state == READY or not ready_only:
                    entries.append(entry)
        return entries

    def _model(self, name: str) -> _Model:
        model = self._models.get(name)
        if model is None:
            raise NotFound(f"unknown model {name!r}")
        return model
