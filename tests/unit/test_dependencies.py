"""Dependencies point one way: ``compose`` (the launcher) may import the
services; a service imports ``shared``, the public package ``aistack`` (the
API user code sees, which svc_trainer implements) and itself, never another
service, ``compose``, ``loadgen``, ``demo``, ``bench`` or the tests;
``aistack`` imports ``shared`` and itself, and its command (``aistack/cli``)
the launcher, the load generator, the demo and the services' entry points;
``shared`` imports only itself. Outside a service, the launcher, the command
and the demo reach only its settings and its declared entry points, never its
insides. Only ``shared`` reads the model registry's log."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OURS = {"shared", "aistack", "compose", "demo", "loadgen", "bench", "tests"}
SERVICES = sorted(p.name for p in ROOT.glob("svc_*") if (p / "__init__.py").is_file())


def parsed_modules(package: str) -> dict[str, ast.Module]:
    """Each module of ``package`` (by path) → its syntax tree."""
    return {
        str(path.relative_to(ROOT)): ast.parse(path.read_text(), str(path))
        for path in sorted((ROOT / package).rglob("*.py"))
        if "__pycache__" not in path.parts
    }


def imported_modules(package: str) -> dict[str, set[str]]:
    """Each module of ``package`` (by path) → the modules it imports, dotted
    (``from pkg import name`` of a top-level package as ``pkg.name``)."""
    found: dict[str, set[str]] = {}
    for module, tree in parsed_modules(package).items():
        names: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if "." in node.module:
                    names.add(node.module)
                else:  # from svc_x import a_module
                    names.update(f"{node.module}.{alias.name}" for alias in node.names)
        found[module] = names
    return found


def imported_packages(package: str) -> dict[str, set[str]]:
    """Each module of ``package`` (by path) → the top-level packages of ours it imports."""
    return {
        module: {
            top
            for top in (name.split(".")[0] for name in names)
            if top in OURS or top.startswith("svc_")
        }
        for module, names in imported_modules(package).items()
    }


ALLOWED = {"shared": {"shared"}, "aistack": {"shared", "aistack"}}
#: The ``aistack`` command runs the stack, the load generator, the demo and a
#: service's entry points (``PUBLIC``); what a user's code imports of the
#: public package needs none of them.
COMMAND = "aistack/cli/"
COMMAND_ALLOWED = {"compose", "loadgen", "demo", *SERVICES}


@pytest.mark.parametrize("package", ["shared", "aistack", *SERVICES])
def test_a_package_imports_only_shared_and_itself(package: str) -> None:
    allowed = ALLOWED.get(package, {"shared", "aistack", package})
    wrong = {}
    for module, names in imported_packages(package).items():
        extra = COMMAND_ALLOWED if module.startswith(COMMAND) else set()
        if names - allowed - extra:
            wrong[module] = sorted(names - allowed - extra)
    assert not wrong, f"{package} imports what it must not: {wrong}"


def test_the_demo_is_a_client_of_the_stack() -> None:
    """The demo drives the stack as a user would: the public package, the
    shared readers, the launcher and the load generator; no benchmark or test."""
    allowed = {"shared", "aistack", "compose", "loadgen", "demo", *SERVICES}
    wrong = {
        module: sorted(names - allowed)
        for module, names in imported_packages("demo").items()
        if names - allowed
    }
    assert wrong == {}


def test_the_services_are_found() -> None:
    expected = {"svc_ingest", "svc_transform", "svc_tuner", "svc_trainer", "svc_model", "svc_score"}
    assert expected <= set(SERVICES)


#: What a service offers the launcher and the command beyond its process
#: (``python -m svc_X``): its settings, and where the ``aistack`` command runs
#: a service's work in its own process, that entry point.
PUBLIC = {
    "svc_score": {"app", "settings"},  # aistack score runs the Spark job in-process
    "svc_transform": {"jars", "settings"},  # aistack infra fetch builds its JVM functions
}


def service_imports(package: str) -> dict[str, set[str]]:
    """Each module of ``package`` → the service modules (``svc_X.a.b``) it imports."""
    return {
        module: {name for name in names if name.startswith("svc_")}
        for module, names in imported_modules(package).items()
    }


def test_outside_a_service_only_its_public_modules_are_imported() -> None:
    """The launcher (``compose``), the public package and its command
    (``aistack``) and the demo reach a service through its settings and the
    entry points in ``PUBLIC``; never its insides. Benchmarks and tests
    measure insides: not held to it."""
    reached: dict[str, set[str]] = {}
    for package in ("compose", "aistack", "demo"):
        for module, names in service_imports(package).items():
            inside = set()
            for name in names:
                service, _, rest = name.partition(".")
                first = rest.split(".")[0]
                if first and first != "settings" and first not in PUBLIC.get(service, set()):
                    inside.add(name)
            if inside:
                reached[module] = inside
    assert reached == {}


#: What svc_trainer's framework code may import of svc_trainer: the plan
#: (the runners' interface and the run spec), the user's code, the process
#: lifetime, and the backends themselves.
BACKEND_DEPENDENCIES = ("svc_trainer.plan", "svc_trainer.user_code", "svc_trainer.lifetime")
#: A torchrun rank's entry point builds its own run spec, as the worker does.
ENTRY_POINTS = {"svc_trainer/backends/torch/torchrun.py"}


def test_the_framework_code_depends_on_the_plan_alone() -> None:
    wrong = {}
    for path, names in service_imports("svc_trainer/backends").items():
        if path in ENTRY_POINTS:
            continue
        outside = {
            name
            for name in names
            if name.startswith("svc_trainer")
            and not name.startswith("svc_trainer.backends")
            and not name.startswith(BACKEND_DEPENDENCIES)
        }
        if outside:
            wrong[path] = sorted(outside)
    assert wrong == {}


#: What reads a topic: the bus's readers, the loop over one, and Kafka's own consumer.
READERS = {"BusTail", "BusConsumer", "read_to_end", "messages_to_end", "ConsumeLoop", "Consumer"}
#: How a reader names the model registry's log: its message, its topic (the
#: constant, each service's setting, the name itself).
MODELS_LOG = {"ModelReady", "MODELS_READY", "models_topic", "aistack.models.ready"}


def _named(node: ast.AST) -> set[str]:
    """Every name, attribute and string constant in ``node``."""
    found = set()
    for inner in ast.walk(node):
        if isinstance(inner, ast.Name):
            found.add(inner.id)
        elif isinstance(inner, ast.Attribute):
            found.add(inner.attr)
        elif isinstance(inner, ast.Constant) and isinstance(inner.value, str):
            found.add(inner.value)
    return found


def _reader(node: ast.AST) -> str:
    """The reader ``node`` names ("" for none): ``BusTail``, ``loop.ConsumeLoop``."""
    name = (
        node.id
        if isinstance(node, ast.Name)
        else node.attr
        if isinstance(node, ast.Attribute)
        else ""
    )
    return name if name in READERS else ""


def models_log_reads(tree: ast.AST) -> list[int]:
    """The lines in ``tree`` that build a reader of the model registry's log:
    a reader called with its message or its topic (``BusTail(kafka,
    topics=[s.models_topic], ...)``), or typed for its message
    (``BusTail[models_pb2.ModelReady]``: a topic passed in a variable)."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _reader(node.func):
            named = set().union(*map(_named, [*node.args, *node.keywords]))
        elif isinstance(node, ast.Subscript) and _reader(node.value):
            named = _named(node.slice)
        else:
            continue
        if named & MODELS_LOG:
            lines.add(node.lineno)
    return sorted(lines)


def test_only_shared_reads_the_model_registry_log() -> None:
    """Every service, command and benchmark that keeps or reads the model
    registry does it through ``shared.model_registry`` (``read``, or its
    ``Follower``), so the log is replayed by one set of rules (issue 34,
    item 5). Naming the topic is fine (settings, ACLs) and so is publishing
    a ModelReady (trainers, ``aistack models register``)."""
    found = {
        module: lines
        for package in [*sorted(OURS - {"shared", "tests"}), *SERVICES]
        for module, tree in parsed_modules(package).items()
        if (lines := models_log_reads(tree))
    }
    assert found == {}


def test_the_rule_finds_a_reader_of_the_models_log() -> None:
    """A tail named by the topic setting, one typed for the message, a
    one-off read and a loop over one are found; a tail of another topic and
    a ModelReady published are not."""
    tree = ast.parse(
        "t = BusTail(kafka, topics=[s.models_topic], message_cls=X)\n"
        "u: BusTail[models_pb2.ModelReady] = make()\n"
        "records = read_to_end(kafka, topic, models_pb2.ModelReady, 5.0)\n"
        "loop = bus.loop.ConsumeLoop[models_pb2.ModelReady](source, handler)\n"
        "w = BusTail(kafka, topics=[s.windows_topic], message_cls=FeatureWindow)\n"
        "producer.publish(s.models_topic, models_pb2.ModelReady(), key=k)\n"
    )
    assert models_log_reads(tree) == [1, 2, 3, 4]
