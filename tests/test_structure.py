"""The package's shape: layers import only downwards, no two files import each other in a
circle, at most two files are long, the experiment layer and the CLI name no attack or
defense, the schema is the one source of every default, every artifact kind has files and
a loader."""

from __future__ import annotations

import ast
import inspect
import re
import subprocess
import sys

import pytest
import torch
from conftest import REPO

from gradleak import attacks, config, defenses
from gradleak.experiment import phases
from gradleak.experiment.phase import Kind
from gradleak.needs import ARTIFACTS

PACKAGE = REPO / "src" / "gradleak"
# docs/architecture.md: each layer may import its own layer (without cycles) and those below.
LAYERS = {
    "types": 0, "settings": 0, "needs": 0, "config": 0, "schema_files": 0, "plugins": 0,
    "utils": 0, "data": 0,
    "models": 0, "metrics": 0,
    "fl": 1, "defenses": 1, "attacks": 1, "adversaries": 1, "report": 1,
    "experiment": 2,
    "cli": 3, "warm": 3,
}


def _unit(module: str) -> str:
    """gradleak.attacks.gias -> attacks; gradleak.cli -> cli."""
    return module.split(".")[1]


def _imports() -> dict[str, set[str]]:
    """Package unit -> the gradleak units its modules import."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        unit = parts[1] if len(parts) > 1 else None
        if unit is None or unit == "__init__":
            continue
        found = graph.setdefault(unit, set())
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] if node.module != "gradleak" else \
                    [f"gradleak.{a.name}" for a in node.names]
            found |= {_unit(n) for n in names if n.startswith("gradleak.")} - {unit}
    return graph


def test_every_unit_has_a_layer():
    assert set(_imports()) == set(LAYERS)


def test_no_unit_imports_a_higher_layer():
    upward = {(unit, dep) for unit, deps in _imports().items() for dep in deps
              if LAYERS[dep] > LAYERS[unit]}
    assert upward == set()


def test_units_import_each_other_without_cycles():
    graph = _imports()

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(dep == goal or (dep not in seen and reaches(dep, goal, seen | {dep}))
                   for dep in graph[start])

    assert [unit for unit in graph if reaches(unit, unit, {unit})] == []


def _file_imports() -> dict[str, set[str]]:
    """Module -> the package's modules its source imports anywhere in it (inside functions
    too): ``from a import b`` is an edge to module ``a.b`` where that is a module, else to
    ``a``. Importing a submodule also runs its package's ``__init__``, which is no edge."""
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        found = graph.setdefault(module, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom) and node.module in modules:
                found |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules
                          else node.module for a in node.names}
        found.discard(module)
    return graph


def test_no_two_files_import_each_other_in_a_circle():
    graph = _file_imports()
    circles = []
    for start in graph:
        seen, todo = set(), list(graph[start])
        while todo:
            module = todo.pop()
            if module == start:
                circles.append(start)
                break
            if module not in seen:
                seen.add(module)
                todo += graph[module]
    assert circles == []


def test_loading_every_phase_s_declaration_leaves_the_plotting_stack_unimported():
    """Every Snakemake start (each SLURM job's too) loads every phase's declaration: the
    report's plotting stack (seaborn, scipy.stats: 2-3 s) is for the jobs that draw."""
    code = ("import sys; from gradleak.experiment import phases; phases.every(); "
            "print(sorted(m for m in ('seaborn', 'scipy.stats', 'gradleak.report') "
            "if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout.strip()
    assert loaded == "[]"


def test_no_file_is_over_400_lines():
    """The package, its tests and the workflow: every file one a reader can hold."""
    files = [*PACKAGE.rglob("*.py"), *(REPO / "tests").rglob("*.py"),
             *(REPO / "workflow").rglob("*.smk"), REPO / "Snakefile"]
    long = {str(p.relative_to(REPO)): n for p in files
            if (n := len(p.read_text().splitlines())) > 400}
    assert not long, long


def test_cli_and_experiment_special_case_no_attack_or_defense():
    """No comparison with an attack or defense name: what a class needs is data on it."""
    names = set(attacks.available()) | set(defenses.available())
    compared = re.compile(r"""(?:==|!=|\bin\s*[\[({])\s*["']([a-z_]+)["']""")
    for path in [PACKAGE / "cli.py", *sorted((PACKAGE / "experiment").rglob("*.py"))]:
        for line in path.read_text().splitlines():
            for match in compared.finditer(line):
                assert match[1] not in names, f"{path.name}: {line.strip()}"


@pytest.mark.parametrize("kind, registry", [("attacks", attacks), ("defenses", defenses)])
def test_every_registered_class_has_a_schema_definition(kind, registry):
    assert registry.available() == sorted(config.schema()["definitions"][kind])


def _classes(kind: str):
    registry = attacks.base._REGISTRY if kind == "attacks" else defenses.base._REGISTRY
    return [(kind, name, registry.get(name)) for name in registry.available()]


@pytest.mark.parametrize("kind, name, cls", [*_classes("attacks"), *_classes("defenses")])
def test_constructor_takes_the_schema_parameters_without_defaults(kind, name, cls):
    schema_params = config.parameters(kind, name)
    signature = inspect.signature(cls)
    declared = {p.name: p for p in signature.parameters.values()
                if p.kind is not inspect.Parameter.VAR_KEYWORD}
    needs = {arg for arg in getattr(cls, "needs", {})}
    extra = set(declared) - set(schema_params) - needs - {"seed", "defense"}
    assert extra == set(), f"{name} takes parameters the schema does not define"
    assert set(schema_params) <= set(declared)
    with_defaults = [p for p in schema_params if declared[p].default is not inspect.Parameter.empty]
    assert with_defaults == [], f"{name} repeats schema defaults in its signature"


def _artifacts(name: str) -> dict:
    from gradleak.adversaries import FeatureNet, ModelZoo
    from gradleak.attacks.lti import Inverter
    from gradleak.models import EvaluationNetwork, Generator

    if name == "recupfl":
        return {"zoo": ModelZoo(8, {"a": 2}, {"a": [FeatureNet(8, [4], 2) for _ in range(5)]})}
    if name == "lti":
        return {"inverter": Inverter(4, 2, (1, 2, 2))}
    generator = Generator(16, 1, 8)
    return {"evalnet": EvaluationNetwork(1, 16, (4, 4, 4)), "generator": generator,
            "defense": defenses.build("none")} if name in {"refiner", "gga", "gias", "gifd",
                                                             "giml", "eot"} else {}


@pytest.mark.parametrize("kind, name, cls", [*_classes("attacks"), *_classes("defenses")])
def test_build_fills_the_schema_defaults(kind, name, cls):
    registry = attacks if kind == "attacks" else defenses
    wanted = set(registry.needs(name, config.resolve(kind, name, {})))
    built = registry.build(name, **{k: v for k, v in _artifacts(name).items() if k in wanted})
    for param, rules in config.definition(kind, name)["properties"].items():
        if hasattr(built, param) and param != "stopper" and "default" in rules:
            value = getattr(built, param)
            assert value == rules["default"] or (
                isinstance(value, (list, tuple)) and list(value) == rules["default"]), param


@pytest.mark.parametrize("kind, registry", [("attacks", attacks), ("defenses", defenses)])
def test_build_rejects_an_unknown_keyword_by_name(kind, registry):
    name = registry.available()[0]
    with pytest.raises(TypeError, match="unknown keyword argument 'iteratons'"):
        registry.build(name, iteratons=3)


def test_every_artifact_kind_has_files_and_a_loader():
    for kind, (_, phase) in ARTIFACTS.items():
        assert isinstance(phases.load(phase).kinds.get(kind), Kind), (kind, phase)
    declared = {k for name in phases.NAMES for k in phases.load(name).kinds}
    assert declared == set(ARTIFACTS)


@pytest.mark.parametrize("kind, registry", [("attacks", attacks), ("defenses", defenses)])
def test_every_need_names_an_artifact_kind(kind, registry):
    reg = attacks.base._REGISTRY if kind == "attacks" else defenses.base._REGISTRY
    for name in reg.available():
        for need in getattr(reg.get(name), "needs", {}).values():
            assert need.kind in ARTIFACTS, (name, need.kind)


def test_eval_mode_is_restored():
    from gradleak.metrics import accuracy
    from gradleak.models import LeNet

    model = LeNet(1, 10, 16).train()
    accuracy(model, torch.rand(4, 1, 16, 16), torch.arange(4))
    assert model.training


def test_workflow_rules_each_have_a_log():
    for path in sorted((REPO / "workflow" / "rules").glob("*.smk")):
        text = path.read_text()
        rules = re.findall(r"^rule (\w+):", text, flags=re.M)
        logs = re.findall(r"^    log:", text, flags=re.M)
        assert len(rules) == len(logs), f"{path.name}: {rules} with {len(logs)} log directives"


def test_workflow_schema_is_the_packaged_schema_read_as_one_document():
    """workflow/schemas is the package's folder of schema files; every section file the
    root refers to is there, and each is referred to."""
    assert (REPO / "workflow" / "schemas").resolve() == (PACKAGE / "schemas").resolve()
    root = (PACKAGE / "schemas" / "config.schema.yaml").read_text()
    referred = set(re.findall(r'\$ref: "([a-z_]+\.schema\.yaml)#/', root))
    assert referred == {p.name for p in (PACKAGE / "schemas").glob("*.schema.yaml")} - {
        "config.schema.yaml"}
    assert not re.search(r"'\$ref': '[^#]", str(config.schema()))  # all inlined


@pytest.mark.slow
def test_snakemake_lint_is_clean(tmp_path):
    import subprocess
    import sys

    from project import ENV, copy_project

    root = copy_project(tmp_path / "project")
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--lint"], cwd=root, env=ENV,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Congratulations, your workflow is in a good condition!" in proc.stdout + proc.stderr
