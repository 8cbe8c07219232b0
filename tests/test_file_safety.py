"""Files opened the right way: rpx writes only the file it was asked to write, never through a link, never over
anything it reads (the spec, model code however it is named, input factories, GPU packs from every source, plugin and
rpx code) and never a special file, ``--force`` or not, all checked before anything is written; an output template
fills ``{name}`` as plain text only; ``validate`` finds an output unwritable where ``run`` would; reading commands
refuse special files and read at most a stated cap.

Real ``rpx`` processes on a real file system (links, FIFOs, devices, a killed lock holder); every command has a short
timeout, so a command that blocks fails its test instead of hanging the suite."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import rpx_cli

QUICK = 60  # seconds any command here may take; none should block

SPEC = """
name = "plain"
backend = "cpu"
stages = ["count_params"]
output = "out/{{name}}.toml"
{extra}
[[models]]
name = "lin"
source = "{source}"
{inputs}
"""
MODEL = "import torch\n\ndef ok():\n    return torch.nn.Linear(4, 2)\n"
FACTORY = "import torch\n\ndef make(batch_size, device, dtype):\n    return (torch.zeros(batch_size, 4),)\n"


def spec_text(source: str = "atkpkg.models:ok", inputs: str = "inputs = [{ shape = [1, 4] }]", extra: str = "") -> str:
    return SPEC.format(source=source, inputs=inputs, extra=extra)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A spec's folder: a model package (``atkpkg.models:ok``, an input factory ``atkpkg.inputs:make``), a model
    file (``x.py:ok``) and ``spec.toml`` naming the package's model."""
    (tmp_path / "atkpkg").mkdir()
    (tmp_path / "atkpkg" / "__init__.py").write_text("# the package\n")
    (tmp_path / "atkpkg" / "models.py").write_text(MODEL)
    (tmp_path / "atkpkg" / "inputs.py").write_text(FACTORY)
    (tmp_path / "x.py").write_text(MODEL)
    (tmp_path / "spec.toml").write_text(spec_text())
    return tmp_path


def rpx(project: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``rpx ARGS`` in the project's folder, its models importable."""
    return rpx_cli(*args, cwd=project, env={"PYTHONPATH": str(project), **(env or {})}, timeout=QUICK)


def refused(done: subprocess.CompletedProcess, *parts: str) -> None:
    """Exit 2 with one error line holding every one of ``parts`` (beside ``rpx run``'s notes, if any)."""
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("rpx: error: "), done.stderr
    assert all(part in lines[0] for part in parts), lines[0]


def contents(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (links as what they point to), to show that nothing was written."""
    return {str(path.relative_to(folder)): (os.readlink(path).encode() if path.is_symlink() else
                                            path.read_bytes() if path.is_file() else b"<special>")
            for path in sorted(folder.rglob("*"))}


# -- the lock file ----------------------------------------------------------------------------------------------------


def test_a_link_planted_as_the_lock_file_is_refused_and_what_it_points_to_is_kept(project):
    (project / "out").mkdir()
    (project / "victim.txt").write_text("precious\n")
    (project / "out" / ".plain.toml.lock").symlink_to("../victim.txt")
    before = contents(project)
    refused(rpx(project, "run", "spec.toml"), "out/.plain.toml.lock is a symbolic link; rpx never follows it")
    assert contents(project) == before  # the victim still says "precious", and no results were written


@pytest.mark.parametrize("plant", ["fifo", "file", "hard link"])
def test_what_is_no_rpx_lock_file_is_refused_and_kept(project, plant):
    lock = project / "out" / ".plain.toml.lock"
    lock.parent.mkdir()
    (project / "victim.txt").write_text("precious\n")
    if plant == "fifo":
        os.mkfifo(lock)
    elif plant == "file":
        lock.write_text("my notes\n")
    else:
        os.link(project / "victim.txt", lock)
    before = contents(project)
    done = rpx(project, "run", "spec.toml")
    refused(done, str(Path("out") / ".plain.toml.lock"), "a FIFO" if plant == "fifo" else "not an rpx lock file")
    assert contents(project) == before


def test_a_lock_left_by_a_killed_run_is_replaced_never_written_into(project):
    """A run killed with SIGKILL leaves its lock file; the next run removes it and creates its own (exclusively):
    a hard link to the old file shows that file was never written again."""
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from pathlib import Path
        from rpx_core.results.safe_write import OutputLock
        OutputLock(Path({str(project / 'out' / 'plain.toml')!r})).acquire()
        print("held", flush=True)
        time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
    finally:
        holder.kill()
        holder.communicate(timeout=QUICK)
    lock = project / "out" / ".plain.toml.lock"
    assert lock.read_text() == f"{holder.pid}\n"
    os.link(lock, project / "old-lock")
    done = rpx(project, "run", "spec.toml", "--isolation", "in-process")
    assert done.returncode == 0, done.stderr
    assert (project / "old-lock").read_text() == f"{holder.pid}\n"
    assert (project / "out" / "plain.toml").is_file() and not os.path.lexists(lock)


# -- never over an input, never a special file --------------------------------------------------------------------------


@pytest.mark.parametrize("target, role", [
    ("atkpkg/models.py", "models[0].source"),
    ("atkpkg/__init__.py", "models[0].source"),  # imported with it
    ("./atkpkg/../atkpkg/models.py", "models[0].source"),
    ("atkpkg/inputs.py", "models[0].input_factory"),
    ("spec.toml", "the spec"),
])
def test_run_never_writes_over_model_code_named_any_way(project, target, role):
    (project / "spec.toml").write_text(spec_text(inputs='input_factory = "atkpkg.inputs:make"'))
    before = contents(project)
    refused(rpx(project, "run", "spec.toml", "-o", target), f"{Path(target)}: refusing to write over", f"({role})")
    assert contents(project) == before


def test_a_named_model_s_local_folder_is_an_input_and_its_configuration_is_read_without_blocking(project):
    (project / "m").mkdir()
    (project / "m" / "config.json").write_text('{"model_type": "gpt2", "n_layer": 1, "n_embd": 8, "n_head": 2}')
    (project / "spec.toml").write_text(spec_text(source="hf:./m", inputs="input_shape = [1, 8]"))
    refused(rpx(project, "run", "spec.toml", "-o", "m/results.toml"), "m/results.toml: refusing to write inside m "
            "(models[0].source)")
    (project / "m" / "config.json").unlink()
    os.mkfifo(project / "m" / "config.json")
    refused(rpx(project, "validate", "spec.toml"), "models[0].source: folder", "has no config.json")


def test_no_command_writes_over_a_gpu_pack_from_any_source(project, example_plugin_site):
    reference = Path(__import__("rpx_plugins").__file__).parent / "packs" / "reference.toml"
    shipped = example_plugin_site / "rpx_example_plugin" / "example_gpus.toml"
    pack = (project / "mine.toml")
    pack.write_text(shipped.read_text())
    (project / "env.toml").write_text(shipped.read_text().replace("Example", "Env"))
    (project / "spec.toml").write_text(spec_text(extra='gpu_packs = ["mine.toml"]'))
    env = {"RPX_GPU_PACKS": str(project / "env.toml"), "PYTHONPATH": f"{project}{os.pathsep}{example_plugin_site}"}
    before, reference_before, shipped_before = contents(project), reference.read_bytes(), shipped.read_bytes()
    try:
        for args, role in [(("run", "spec.toml", "-o", "mine.toml"), "gpu_packs[0]"),
                           (("run", "spec.toml", "-o", "env.toml"), "a GPU pack named in RPX_GPU_PACKS"),
                           (("run", "spec.toml", "-o", str(reference)), "a GPU pack of plugin 'reference-gpus'"),
                           (("init", "x.py:ok", "-o", str(shipped), "--force"), "a GPU pack of plugin 'example'"),
                           (("init", "x.py:ok", "-o", str(shipped.with_name("plugin.py")), "--force"),
                            "code of plugin 'example'")]:
            refused(rpx(project, *args, env=env), "refusing to write", role)
    finally:  # never leave rpx's own pack damaged, even when the refusal fails
        if reference.read_bytes() != reference_before:
            reference.write_bytes(reference_before)
    assert contents(project) == before and shipped.read_bytes() == shipped_before


def test_profile_save_spec_never_writes_over_the_model_and_checks_before_writing(project):
    before = contents(project)
    refused(rpx(project, "profile", "x.py:ok", "--input", "1x4", "--save-spec", "x.py"),
            "x.py: refusing to write over x.py (MODEL)")
    refused(rpx(project, "profile", "x.py:ok", "--input", "1x4", "--save-spec", "s.toml", "-o", "x.py"),
            "x.py: refusing to write over x.py (MODEL)")  # the results path too, before the spec is saved
    assert contents(project) == before


@pytest.mark.parametrize("model, target", [("x.py:ok", "x.py"), ("atkpkg.models:ok", "atkpkg/models.py"),
                                           ("atkpkg.models:ok", "atkpkg/__init__.py")])
def test_init_force_never_overwrites_the_model_it_describes(project, model, target):
    before = contents(project)
    refused(rpx(project, "init", model, "-o", target, "--force"), f"{target}: refusing to write over", "(the model)")
    assert contents(project) == before


def test_report_and_plot_never_write_over_their_inputs_or_into_a_fifo(project, roofline_results):
    results, _ = roofline_results
    html = project / "res.html"  # a results file may have any suffix: it is read by its content
    html.write_bytes(results.read_bytes())
    os.mkfifo(project / "fifo.png")
    os.mkfifo(project / "fifo.html")
    before = contents(project)
    refused(rpx(project, "report", "res.html", "-o", "res.html"), "(a results file the report shows)")
    refused(rpx(project, "plot", str(results), "-o", "fifo.png"), "fifo.png: is a FIFO, not a regular file")
    refused(rpx(project, "report", str(results), "-o", "fifo.html"), "fifo.html: is a FIFO, not a regular file")
    refused(rpx(project, "run", "spec.toml", "-o", "/dev/null"), "/dev/null: is a character device")
    assert contents(project) == before


def test_plot_writes_its_chart_atomically_where_asked(project, roofline_results):
    results, _ = roofline_results
    done = rpx(project, "plot", str(results), "-o", "charts/roofline.svg")
    assert done.returncode == 0, done.stderr
    assert (project / "charts" / "roofline.svg").read_text().rstrip().endswith("</svg>")
    assert sorted(path.name for path in (project / "charts").iterdir()) == ["roofline.svg"]  # no temporary left


# -- output templates and writability ----------------------------------------------------------------------------------


def test_an_output_template_that_reaches_into_python_is_refused_at_validate_time(project):
    (project / "spec.toml").write_text(spec_text().replace('"out/{name}.toml"', '"out/{name.__class__}.toml"'))
    refused(rpx(project, "validate", "spec.toml"), "spec.toml: output: 'out/{name.__class__}.toml' is not a valid "
            "template: {name.__class__} is not a field rpx fills; only {name} is (write {{ and }} for a literal brace)")
    refused(rpx(project, "run", "spec.toml"), "spec.toml: output: 'out/{name.__class__}.toml' is not a valid template")
    assert not (project / "out").exists()


@pytest.mark.parametrize("template", ["{name[0]}", "{0}", "{}", "{name!r}", "{name:>40}", "{nme}", "{", "}"])
def test_output_templates_fill_only_name(tmp_path, template):
    from rpx_core.errors import SpecError
    from rpx_core.spec.schema import load_spec

    (tmp_path / "spec.toml").write_text(spec_text().replace('"out/{name}.toml"', f'"out/{template}.toml"'))
    with pytest.raises(SpecError) as error:
        load_spec(tmp_path / "spec.toml")
    assert str(error.value).startswith(f"{tmp_path / 'spec.toml'}: output: 'out/{template}.toml' is not a valid "
                                       "template: ")


def test_name_fills_the_template_as_plain_text():
    from rpx_core.spec.schema import fill_output

    assert fill_output("r/{{x}}-{name}-{name}.toml", "a.b") == "r/{x}-a.b-a.b.toml"
    assert fill_output("r/{name}.toml", "{0.__class__}") == "r/{0.__class__}.toml"  # the name is never a template


@pytest.mark.skipif(not Path("/proc/self").is_dir() or not Path("/sys/kernel").is_dir(), reason="needs Linux")
@pytest.mark.parametrize("output", ["/proc/rpx-results.toml", "/sys/kernel/rpx/results.toml"])
def test_validate_refuses_an_output_run_could_not_write(project, output):
    (project / "spec.toml").write_text(spec_text().replace('"out/{name}.toml"', f'"{output}"'))
    validated = rpx(project, "validate", "spec.toml")
    refused(validated, output)
    ran = rpx(project, "run", "spec.toml")
    assert ran.returncode == 2 and ran.stderr == validated.stderr  # run refuses it with the same line


def test_validate_leaves_nothing_behind_where_it_tried(project):
    (project / "spec.toml").write_text(spec_text().replace('"out/{name}.toml"', '"new/folder/r.toml"'))
    before = contents(project)
    done = rpx(project, "validate", "spec.toml")
    assert done.returncode == 0, done.stderr
    assert contents(project) == before


# -- reading ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("args, what", [
    (("show", "/dev/zero"), "/dev/zero: cannot read the results file: it is a character device"),
    (("show", "fifo"), "fifo: cannot read the results file: it is a FIFO"),
    (("compare", "fifo", "fifo"), "fifo: cannot read the results file: it is a FIFO"),
    (("report", "fifo", "-o", "r.html"), "fifo: cannot read the results file: it is a FIFO"),
    (("plot", "fifo", "-o", "r.png"), "fifo: cannot read the results file: it is a FIFO"),
    (("validate", "fifo"), "fifo: cannot read the spec: it is a FIFO"),
    (("gpus", "--pack", "fifo"), "fifo: cannot read the pack: it is a FIFO"),
])
def test_reading_commands_refuse_special_files_at_once(project, args, what):
    os.mkfifo(project / "fifo")
    refused(rpx(project, *args), what)


def test_run_resume_refuses_a_fifo_output_without_blocking(project):
    (project / "out").mkdir()
    os.mkfifo(project / "out" / "plain.toml")
    refused(rpx(project, "run", "spec.toml", "--resume"), "out/plain.toml: is a FIFO, not a regular file")


def test_reads_stop_at_the_stated_caps(project):
    """Sparse files just over each cap: refused from their size, before a byte is read."""
    from rpx_core.safe_read import RESULTS_LIMIT, TEXT_LIMIT

    (project / "out").mkdir()
    os.truncate(_touch(project / "out" / "plain.toml"), RESULTS_LIMIT + 1)
    os.truncate(_touch(project / "big-spec.toml"), TEXT_LIMIT + 1)
    os.truncate(_touch(project / "big-pack.toml"), TEXT_LIMIT + 1)
    cap = "it is larger than the {} MiB rpx reads of such a file"
    refused(rpx(project, "show", "out/plain.toml"), "cannot read the results file", cap.format(512))
    refused(rpx(project, "run", "spec.toml", "--resume"), "cannot read the results file", cap.format(512))
    refused(rpx(project, "validate", "big-spec.toml"), "cannot read the spec", cap.format(16))
    refused(rpx(project, "gpus", "--pack", "big-pack.toml"), "cannot read the pack", cap.format(16))


def _touch(path: Path) -> Path:
    path.write_bytes(b"")
    return path
