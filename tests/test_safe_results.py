"""Safe results: only a regular file or a new path is written, never an input; one run per output; names cannot
leave the output folder; exit codes stay the same with --debug; damaged results files are one clear line."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import attrs
import pytest

import rpx_core as rpx
from rpx_core.cli import main
from rpx_core.errors import RpxError
from rpx_core.results.records import RunResult
from rpx_core.results.safe_write import OutputError, OutputLock, atomic_write, check_target, path_safe
from rpx_core.results.serialise import dumps

SPEC = """
name = "{name}"
stages = ["count_params"]
[[models]]
name = "lin"
source = "torch.nn:Linear"
kwargs = {{ in_features = 4, out_features = 2 }}
inputs = [{{ shape = [1, 4] }}]
"""


def spec_file(tmp_path: Path, name: str = "lin") -> Path:
    path = tmp_path / "spec.toml"
    path.write_text(textwrap.dedent(SPEC.format(name=name)))
    return path


def run_cli(capsys, *args: str) -> tuple[int, str]:
    code = main(list(args))
    return code, capsys.readouterr().err


def test_output_over_the_spec_is_refused_and_the_spec_kept(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = spec_file(tmp_path)
    before = spec.read_text()
    code, err = run_cli(capsys, "run", "spec.toml", "-o", "spec.toml")
    assert code == 2
    assert err == "rpx: error: spec.toml: refusing to write over spec.toml (the spec), which rpx reads\n"
    assert spec.read_text() == before


def test_output_over_a_model_file_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.py").write_text("import torch\ndef build():\n    return torch.nn.Linear(4, 2)\n")
    (tmp_path / "spec.toml").write_text(SPEC.format(name="x").replace("torch.nn:Linear", "net.py:build")
                                        .replace("kwargs = { in_features = 4, out_features = 2 }\n", ""))
    code, err = run_cli(capsys, "run", "spec.toml", "-o", "net.py")
    assert code == 2 and err == "rpx: error: net.py: refusing to write over net.py (models[0].source), which rpx reads\n"
    assert "def build" in (tmp_path / "net.py").read_text()


@pytest.mark.parametrize("target, kind", [("/dev/null", "a character device"), (".", "a folder")])
def test_only_regular_files_are_replaced(tmp_path, target, kind):
    with pytest.raises(OutputError) as error:
        check_target(Path(target))
    assert str(error.value) == f"{target}: is {kind}, not a regular file; rpx writes only to a regular file or a new path"
    assert Path("/dev/null").is_char_device()


def test_read_only_results_and_symbolic_links_are_not_replaced(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec_file(tmp_path)
    locked = tmp_path / "locked.toml"
    locked.write_text("old")
    locked.chmod(0o444)
    code, err = run_cli(capsys, "run", "spec.toml", "-o", "locked.toml")
    assert code == 2
    assert err == "rpx: error: locked.toml: is read-only; rpx does not replace a file it may not write\n"
    assert locked.read_text() == "old"
    (tmp_path / "link.toml").symlink_to(tmp_path / "elsewhere.toml")
    with pytest.raises(OutputError, match=r"link.toml: is a symbolic link; give the path it points to"):
        check_target(tmp_path / "link.toml")


def test_atomic_write_uses_a_unique_temporary_file_in_the_target_folder(tmp_path):
    target = tmp_path / "r.toml"
    seen: list[set[str]] = []

    def write(text: str) -> None:
        atomic_write(target, text)
        seen.append({p.name for p in tmp_path.iterdir()})

    threads = [threading.Thread(target=write, args=(f"v = {i}\n" * 2000,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert target.read_text() in {f"v = {i}\n" * 2000 for i in range(8)}  # one whole version, never a mix
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.toml"]  # no temporary file left


def test_a_second_run_on_the_same_output_is_refused_while_the_first_holds_it(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec_file(tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from rpx_core.results.safe_write import OutputLock
        with OutputLock(Path({str(tmp_path / 'out.toml')!r})):
            print("held", flush=True)
            sys.stdin.readline()
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        code, err = run_cli(capsys, "run", "spec.toml", "-o", "out.toml")
        assert code == 2
        assert err == (f"rpx: error: out.toml: another rpx run (process {holder.pid}) is writing these results; wait "
                       "for it to finish or give another output (-o)\n")
        assert not (tmp_path / "out.toml").exists()
    finally:
        holder.communicate("\n", timeout=60)
    with OutputLock(tmp_path / "out.toml"):  # released with its process: free again
        pass
    assert not (tmp_path / ".out.toml.lock").exists()


def test_the_spec_name_enters_the_output_path_as_one_safe_component(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec_file(tmp_path, name="../../x")
    code, err = run_cli(capsys, "run", "spec.toml")
    assert code == 0, err
    assert (tmp_path / "rpx-results" / "_.._x.toml").is_file()
    assert not (tmp_path.parent / "x.toml").exists()
    assert path_safe("a/b\\c\x00d") == "a_b_c_d" and path_safe("...") == "_" and path_safe("ok-1.2") == "ok-1.2"


def test_debug_adds_a_traceback_and_keeps_the_exit_code(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('stages = ["count_flop"]\n' + SPEC.format(name="x").split("stages")[1].split("\n", 1)[1])
    plain = subprocess.run([sys.executable, "-m", "rpx_core.cli", "validate", str(bad)], capture_output=True, text=True)
    debug = subprocess.run([sys.executable, "-m", "rpx_core.cli", "validate", str(bad), "--debug"], capture_output=True,
                           text=True)
    assert plain.returncode == debug.returncode == 2
    assert "Traceback" not in plain.stderr and "Traceback" in debug.stderr
    assert debug.stderr.rstrip().endswith(plain.stderr.rstrip())


def test_json_written_to_a_toml_path_loads(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec_file(tmp_path)
    code, err = run_cli(capsys, "run", "spec.toml", "-o", "res.toml", "--format", "json")
    assert code == 0, err
    assert (tmp_path / "res.toml").read_text().startswith("{")
    assert rpx.load_results(tmp_path / "res.toml").model("lin").result("count_params").total == 10


def test_damaged_results_are_one_line_with_the_right_key_path(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(RpxError) as deep:
        rpx.load_results(path)
    assert str(deep.value) == f"{path}: not a valid TOML results file: nested too deeply"
    run = RunResult(provenance=rpx.run_spec(rpx.load_spec(spec_file(tmp_path)), output=None).provenance)
    text = dumps(run).replace('python = "', 'python = 3 #"')
    path.write_text(text)
    with pytest.raises(RpxError) as wrong:
        rpx.load_results(path)
    assert str(wrong.value) == f"{path}: not an rpx results file: provenance.python: expected a string, got int 3"


def test_the_exit_code_table_is_what_the_cli_returns():
    from rpx_core.exit_codes import ExitCode, for_signal

    assert [int(code) for code in ExitCode] == [0, 1, 2, 3, 130, 143]
    assert for_signal(15) == 143 and for_signal(2) == 130
    assert os.EX_OK == ExitCode.OK


def test_resume_accepts_other_limits_and_refuses_another_spec_naming_what_changed(tmp_path, capsys, monkeypatch):
    """[execution] changes how jobs run, not what they measure: a run resumes under other limits. Any other change
    is refused with the key paths that differ, and the file is left as it was."""
    monkeypatch.chdir(tmp_path)
    spec = spec_file(tmp_path)
    assert run_cli(capsys, "run", "spec.toml", "-o", "out.toml")[0] == 0
    first = (tmp_path / "out.toml").read_text()
    spec.write_text(spec.read_text() + "[execution]\nstage_timeout = 30\n")
    code, err = run_cli(capsys, "run", "spec.toml", "-o", "out.toml", "--resume")
    assert code == 0, err
    spec.write_text(spec.read_text().replace("out_features = 2", "out_features = 3"))
    resumed = (tmp_path / "out.toml").read_text()
    code, err = run_cli(capsys, "run", "spec.toml", "-o", "out.toml", "--resume")
    assert code == 2
    assert err.startswith("rpx: error: out.toml: cannot resume: the spec changed (models[0].kwargs.out_features);")
    assert (tmp_path / "out.toml").read_text() == resumed
    assert rpx.load_results(tmp_path / "out.toml").model("lin").stages["count_params"].result.total == 8 + 2
    assert "count_params" in first


def test_results_that_only_count_are_written_within_the_write_interval_even_if_nothing_else_happens(tmp_path):
    """A "due" change just after a write waits for the interval, then a timer writes it: a long job running after a
    short one cannot hold the short one's results back."""
    import time

    from rpx_core.results.records import Provenance
    from rpx_core.results.serialise import load
    from rpx_core.results.writer import WRITE_INTERVAL, ResultsFile

    path = tmp_path / "out.toml"
    results = ResultsFile(RunResult(Provenance("0.1.0", "3.11", "now", "0" * 16, {})), path)
    results.update()
    results.update(save="due", provenance=attrs.evolve(results.run.provenance, command="rpx run later"))
    assert load(path).provenance.command is None  # not yet: the interval has not passed
    time.sleep(WRITE_INTERVAL + 0.5)
    assert load(path).provenance.command == "rpx run later"
    results.update(save="later", provenance=attrs.evolve(results.run.provenance, command="with the next write"))
    time.sleep(WRITE_INTERVAL + 0.2)
    assert load(path).provenance.command == "rpx run later"
    results.flush()
    assert load(path).provenance.command == "with the next write"
