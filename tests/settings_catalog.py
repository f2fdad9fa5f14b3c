"""Every environment variable aistack's settings classes read, derived from the code.

The classes are found in every ``settings.py`` module of the project's
packages (pyproject.toml's wheel packages), so a new settings class is covered
without editing this file. The classes a process builds are the leaves of the
hierarchy: a base that others extend (``ServiceSettings``,
``GrpcServerSettings``) is never built, so its own prefix never applies to
its fields; its subclasses read them under theirs.

A field's variable is its class's ``env_prefix`` plus the field name,
upper-cased. A field whose type is itself a settings class (``common``,
``kafka``, ``redis``, ``spark``, ``infra``) is not a variable: that class's own
fields are, under its own prefix.
"""

from __future__ import annotations

import importlib
import inspect
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from pydantic_settings import BaseSettings

ROOT = Path(__file__).resolve().parents[1]

#: Classes the discovery must find; a test fails when it does not, which
#: would mean the discovery (not the code) is broken.
EXPECTED = frozenset(
    {
        "shared.settings.CommonSettings",
        "shared.settings.KafkaSettings",
        "shared.settings.RedisSettings",
        "compose.settings.InfraSettings",
        "compose.settings.StackSettings",
        "svc_ingest.settings.IngestSettings",
        "shared.settings.SparkSettings",
        "svc_transform.settings.TransformSettings",
        "svc_tuner.settings.TunerSettings",
        "svc_trainer.settings.TrainerSettings",
        "svc_model.settings.ModelSettings",
        "aistack.settings.LineageSettings",
    }
)


@dataclass(frozen=True)
class Setting:
    env: str
    owner: type[BaseSettings]
    field: str


def qualified_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def settings_modules() -> list[str]:
    """Every ``settings.py`` of the project's packages, as a module name."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    found: list[str] = []
    for package in packages:
        for path in sorted((ROOT / package).rglob("settings.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if "__pycache__" not in parts:
                found.append(".".join(parts))
    return found


@cache
def settings_classes() -> tuple[type[BaseSettings], ...]:
    """The settings classes processes build: the leaves of the project's hierarchy."""
    defined: list[type[BaseSettings]] = []
    for name in settings_modules():
        module = importlib.import_module(name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, BaseSettings) and cls.__module__ == name:
                defined.append(cls)
    bases = {base for cls in defined for base in cls.__mro__[1:]}
    return tuple(cls for cls in defined if cls not in bases)


def env_prefix(cls: type[BaseSettings]) -> str:
    return str(cls.model_config.get("env_prefix", "")).upper()


def _settings_type(annotation: object) -> type[BaseSettings] | None:
    if inspect.isclass(annotation) and issubclass(annotation, BaseSettings):
        return annotation
    return None


@cache
def settings() -> dict[str, Setting]:
    """Every variable the code reads, by name."""
    out: dict[str, Setting] = {}
    pending = list(settings_classes())
    seen: set[type[BaseSettings]] = set()
    while pending:
        cls = pending.pop()
        if cls in seen:
            continue
        seen.add(cls)
        for name, info in cls.model_fields.items():
            nested = _settings_type(info.annotation)
            if nested is not None:
                pending.append(nested)
                continue
            env = f"{env_prefix(cls)}{name}".upper()
            out.setdefault(env, Setting(env=env, owner=cls, field=name))
    return out


def env_names() -> frozenset[str]:
    return frozenset(settings())


def env_prefixes() -> tuple[str, ...]:
    """The classes' prefixes, longest first (so ``AISTACK_KAFKA_`` wins over ``AISTACK_``)."""
    prefixes = {env_prefix(setting.owner) for setting in settings().values()}
    return tuple(sorted(prefixes, key=lambda p: (-len(p), p)))
