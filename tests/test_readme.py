"""The README stays true to the code: every key the spec loader accepts is in its spec-key table, and its layout
section names every folder of the tree and only paths that exist."""

from __future__ import annotations

import re
from pathlib import Path

import attrs

from rpx_core.spec.limits import Execution
from rpx_core.spec.schema import Choices, InputSpec, ModelSpec, Spec, Sweep
from tests.conftest import REPO

README = REPO / "README.md"
SET_BY_RPX = {"base_dir", "backend_inferred"}  # Spec fields the loader refuses in a file


def readme_section(heading: str) -> str:
    text = README.read_text()
    start = text.index(f"\n{heading}\n")
    end = text.find("\n#", start + 1)
    return text[start : end if end != -1 else len(text)]


def accepted_spec_keys() -> set[str]:
    """Every key path a spec file may set, from the attrs models the loader structures it into."""
    nested = {"models": ModelSpec, "execution": Execution, "choose": Choices, "sweep": Sweep}
    keys = {name for name in attrs.fields_dict(Spec) if name not in SET_BY_RPX | set(nested) | {"options"}}
    keys |= {"models", "options.<stage>"}
    keys |= {f"execution.{name}" for name in attrs.fields_dict(Execution)}
    keys |= {f"choose.{name}" for name in attrs.fields_dict(Choices)}
    keys |= {f"sweep.{name}" for name in attrs.fields_dict(Sweep)}
    keys |= {f"models[].{name}" for name in attrs.fields_dict(ModelSpec)}
    keys |= {f"models[].inputs[].{name}" for name in attrs.fields_dict(InputSpec)}
    return keys


def test_the_readme_documents_every_spec_key():
    table = readme_section("### Every spec key")
    documented = re.findall(r"^\| `([^`]+)` \|", table, flags=re.MULTILINE)
    assert len(documented) == len(set(documented)), "a key is documented twice"
    assert set(documented) == accepted_spec_keys()


def layout_paths() -> list[Path]:
    """The paths the README's layout block names: folders end in ``/``; an entry indented under a folder is in it."""
    block = readme_section("## Layout").split("```")[1]
    parents: list[tuple[int, Path]] = []
    named = []
    for line in block.strip("\n").splitlines():
        indent = len(line) - len(line.lstrip())
        entries = []
        for word in line.split():
            if not re.fullmatch(r"[\w.-]+(/|\.py|\.toml|\.md),?", word):
                break
            entries.append(word.rstrip(","))
        if not entries:
            continue  # a description continued from the line above
        parents = [(level, path) for level, path in parents if level < indent]
        base = parents[-1][1] if parents else REPO
        for entry in entries:
            named.append(base / entry)
            if entry.endswith("/"):
                parents.append((indent, base / entry))
    return named


def test_every_path_the_layout_names_exists():
    missing = [str(path.relative_to(REPO)) for path in layout_paths() if not path.exists()]
    assert missing == []


def test_the_layout_names_every_folder_of_the_tree():
    named = {path.resolve() for path in layout_paths()}
    ignored = {"__pycache__", "build", "dist", "rpx-results"}

    def folders(root: Path, deep: bool) -> list[Path]:
        found = []
        for path in sorted(root.iterdir()):
            if path.is_dir() and not path.name.startswith(".") and path.name not in ignored \
                    and not path.name.endswith(".egg-info"):
                found.append(path)
                if deep:
                    found.extend(folders(path, deep))
        return found

    tree = [*folders(REPO, deep=False), *folders(REPO / "rpx_core", deep=True), *folders(REPO / "rpx_plugins", deep=True)]
    assert [str(path.relative_to(REPO)) for path in tree if path.resolve() not in named] == []
    public = ["plugin.py", "registry/hookspecs.py", "registry/stages.py", "testing.py"]
    assert all((REPO / "rpx_core" / name).resolve() in named for name in public)


def test_the_first_command_describes_what_the_default_spec_runs():
    """The newcomer's first command says what the default spec does: every tier it runs, measured latency included."""
    import tomllib

    stages = tomllib.loads((REPO / "specs" / "default.toml").read_text())["stages"]
    sentence = readme_section("## Two commands").split("```")[0]
    assert ("measured latency" in sentence) == ("measure_latency" in stages)
    assert ("rooflines" in sentence) == ("roofline" in stages) and "system card" in sentence


def test_the_show_example_is_what_rpx_prints():
    """The `rpx show` block under "Reading results" is the command's real output for the file it names."""
    from rpx_core.commands.show import show_text
    from tests.conftest import builtin_stages

    block = readme_section("## Reading results").split("```text\n")[1].split("```")[0]
    command, _, shown = block.partition("\n")
    assert command == "$ rpx show tests/data/run_a_results.toml"
    from rpx_core.api import load_results

    run = load_results(REPO / "tests" / "data" / "run_a_results.toml")
    assert shown == show_text(run, builtin_stages(), "table")


def test_every_column_the_conventions_name_is_a_column_rpx_prints():
    """"column `X`" in the README names a column title rpx really prints."""
    from rpx_core.api import load_results
    from rpx_core.show import declared
    from tests.conftest import builtin_stages

    stages = builtin_stages()
    titles = {title for name in ("run_a", "batch")
              for table in declared.tables(load_results(REPO / "tests" / "data" / f"{name}_results.toml"), stages,
                                        declared.table_views(stages))
              for title in table.titles}
    named = re.findall(r"column `([^`]+)`", README.read_text())
    assert named and [name for name in named if name not in titles] == []
