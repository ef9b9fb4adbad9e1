"""What is public is declared: every public module names its API in ``__all__``, the options a target
declaration takes are one typed list (``TargetOptions``), and the docs' parameter table lists exactly those.

The modules are read from their source (the integrations need their frameworks to import), the table from
docs/writing-a-target.md; nothing here starts a process. What a type checker sees of them:
tests/package/test_type_checker.py.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import pytest_resume_check
from pytest_resume_check.targets import Target, TargetOptions, resume_target

PACKAGE = Path(pytest_resume_check.__file__).parent
DOCS = PACKAGE.parent / "docs"

#: The public modules: the package, its top-level modules and the integrations (docs/design.md, "Module map").
PUBLIC_MODULES = sorted(
    ["__init__", *(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"),
     *(f"integrations/{p.stem}" for p in (PACKAGE / "integrations").glob("*.py") if p.stem != "__init__")])

#: Options a declaration takes besides ``TargetOptions``: they are the declaration's own parameters.
DECLARATION_PARAMETERS = {"name", "steps"}


def declared_all(tree: ast.Module) -> list[str] | None:
    """The literal ``__all__`` of a module (``sorted(...)`` of a dict's keys counts: the package's own)."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            value = node.value
            if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "sorted":
                return [] if not value.args else ["<computed>"]
            return list(ast.literal_eval(value))
    return None


def top_level_names(tree: ast.Module) -> set[str]:
    """Names a module binds at its top level (definitions, assignments, imports)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node in tree.body:
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_each_public_module_declares_its_names_and_each_exists(module):
    tree = ast.parse((PACKAGE / f"{module}.py").read_text(encoding="utf-8"))
    names = declared_all(tree)
    assert names is not None, f"pytest_resume_check/{module}.py declares no __all__"
    assert len(names) == len(set(names)), f"{module}: a name twice in __all__"
    if names == ["<computed>"]:
        return
    missing = set(names) - top_level_names(tree)
    assert not missing, f"{module}: __all__ names what the module does not define: {sorted(missing)}"


def test_the_package_all_names_what_it_exports():
    assert set(pytest_resume_check.__all__) == set(pytest_resume_check._EXPORTS)
    for name in pytest_resume_check.__all__:
        assert getattr(pytest_resume_check, name) is not None


def test_the_unreleased_old_name_of_the_protocol_version_is_gone():
    from pytest_resume_check import client

    assert not hasattr(client, "PROTOCOL")
    assert client.PROTOCOL_VERSION == 1


def parameter_table() -> list[str]:
    """The first column of the "Parameters" table of docs/writing-a-target.md."""
    text = (DOCS / "writing-a-target.md").read_text(encoding="utf-8")
    block = text.split("| parameter | meaning |", 1)[1].split("\n\n", 1)[0]
    return [m.group(1) for m in re.finditer(r"^\| `(\w+)` \|", block, re.MULTILINE)]


def test_the_docs_parameter_table_lists_every_option_once_and_no_other():
    documented = parameter_table()
    options = set(TargetOptions.__optional_keys__) | DECLARATION_PARAMETERS
    assert len(documented) == len(set(documented)), "an option has two rows"
    assert not options - set(documented), f"options the docs' table leaves out: {sorted(options - set(documented))}"
    assert not set(documented) - options, f"rows for no option: {sorted(set(documented) - options)}"


def test_every_option_is_a_field_of_the_target():
    """Each option lands in the field of its name, so its default and meaning are read there."""
    fields = set(Target.__dataclass_fields__)
    assert set(TargetOptions.__optional_keys__) | DECLARATION_PARAMETERS <= fields


def some_target(run):
    """A target function at module level (a declaration refuses a nested one)."""


def test_an_unknown_option_fails_as_an_unknown_keyword():
    with pytest.raises(TypeError, match=r"resume_target\(\) got an unexpected keyword argument 'stesp'"):
        resume_target(some_target, steps=2, stesp=3)
    with pytest.raises(TypeError, match=r"resume_target\(\) got an unexpected keyword argument 'cwdd'"):
        resume_target.command(["{python}", "x.py"], name="x", steps=2, cwdd=".")  # type: ignore[call-arg]


def test_both_call_forms_make_a_target():
    assert isinstance(resume_target(some_target, steps=2), Target)
    assert isinstance(resume_target(steps=2)(some_target), Target)
