"""``rpx show``: every table format rendered from results files made by real runs (tests/data, see its README),
with figures checked against the files' own numbers."""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rpx_core.api import load_results
from rpx_core.commands.show import show_text as show_with
from rpx_core.errors import RpxError
from rpx_core.show import declared, units
from rpx_plugins.stages import batch_search, counts
from rpx_plugins.stages import latency as latency_views
from tests.conftest import builtin_stages

STAGES = builtin_stages()


def show_text(run, fmt, names=None):
    return show_with(run, STAGES, fmt, names)

DATA = Path(__file__).parent / "data"
RUN_A, BATCH = DATA / "run_a_results.toml", DATA / "batch_results.toml"
SERVING = DATA / "serving_results.toml"


@pytest.fixture(scope="module")
def run_a():
    return load_results(RUN_A)


@pytest.fixture(scope="module")
def batch():
    return load_results(BATCH)


def test_tier1_cells_are_the_files_figures_in_human_units(run_a):
    table = counts.tier1(run_a)
    flops = run_a.model("tiny-cnn").result("count_flops")
    row = next(row for row in table.rows if row[0].value == "tiny-cnn")
    cell = row[table.titles.index("FLOPs")]
    assert cell.value == flops.total_flops
    # independently: MFLOP is 1e6 FLOPs, three significant digits
    assert cell.text == f"{float(f'{flops.total_flops / 1e6:.3g}'):.2f} MFLOP"


def test_terminal_shows_every_default_table_and_the_system_footer(run_a):
    text = show_text(run_a, "table")
    for title in ("Tier 1", "Tier 2: roofline", "Tier 3: measured latency", "Tier 3: throughput"):
        assert title in text
    assert "system: " in text and "schema 1" in text
    bound = run_a.model("tiny-cnn").result("roofline").gpus["H100-SXM"]["fp32"].bound_ms_fused
    assert units.milliseconds(bound) in text
    assert "e-0" not in text  # no scientific notation anywhere


def test_markdown_has_one_pipe_table_per_table(run_a):
    text = show_text(run_a, "markdown")
    headings = [line for line in text.splitlines() if line.startswith("### ")]
    assert len(headings) == len(declared.tables(run_a, STAGES))
    tier1 = text.split("### Tier 1")[1].split("###")[0]
    rows = [line for line in tier1.splitlines() if line.startswith("|")]
    assert len(rows) == 2 + len(run_a.models)  # header, alignment row, one per model
    assert rows[1].count("---") == len(counts.tier1(run_a).columns)


def test_csv_is_the_flat_summary_with_raw_values(run_a):
    rows = list(csv.DictReader(io.StringIO(show_text(run_a, "csv"))))
    assert [row["model"] for row in rows] == [model.name for model in run_a.models]
    for row, model in zip(rows, run_a.models):
        assert float(row["flops_g"]) == pytest.approx(model.summary["flops_g"], rel=1e-3)
    operators = list(csv.reader(io.StringIO(show_text(run_a, "csv", ["operators"]))))
    assert operators[0][:3] == ["model", "operator", "calls"]
    assert len(operators) > 2


def test_json_carries_raw_values_of_every_table(run_a):
    data = json.loads(show_text(run_a, "json", ["tier1", "latency"]))
    tier1 = data["tables"]["tier1"]
    column = tier1["columns"].index("params")
    assert [row[column] for row in tier1["rows"]] == [m.result("count_params").total for m in run_a.models]
    latency = data["tables"]["latency"]
    p50 = latency["columns"].index("p50 [ms]")
    assert latency["rows"][0][p50] == run_a.models[0].result("measure_latency").p50_ms


def test_batch_search_table_marks_the_choice_and_the_failures(batch):
    result = batch.run_stages["batch_search"].result
    table = batch_search.trials_table(batch)
    assert len(table.rows) == len(result.trials)
    chosen = [row for row in table.rows if row[0].text.endswith("*")]
    assert [row[0].value for row in chosen] == [result.chosen_trial]
    outcomes = table.column("outcome")
    assert outcomes.count("ok") == len(result.ok_trials) and len(outcomes) > len(result.ok_trials)
    assert any(note.startswith("chosen: trial") for note in table.notes)


def test_noisy_and_thin_latency_is_marked(run_a):
    import attrs

    latency = run_a.models[0].result("measure_latency")
    assert latency_views.latency_marks(attrs.evolve(latency, verdict="noisy")) == latency_views.NOISY
    assert latency_views.latency_marks(attrs.evolve(latency, verdict="too_few_samples")) == latency_views.PARTIAL
    assert latency_views.latency_marks(attrs.evolve(latency, verdict="stable")) == ""
    # a file older than verdicts: judged by its spread warning and where sampling stopped
    assert latency_views.latency_marks({"noisy_warning": "noisy machine", "stopped_by": "max_seconds"}) == "~!"
    assert latency_views.latency_marks({"stopped_by": "min_samples"}) == ""
    assert latency_views.interval_text({"p50_interval_ms": [0.5, 0.52], "interval_confidence": 0.95}) == "500 µs – 520 µs (95%)"
    # the table shows the mark on the p50 and the verdict in words
    thin = attrs.evolve(run_a, models=(attrs.evolve(run_a.models[0], stages={
        **run_a.models[0].stages, "measure_latency": attrs.evolve(run_a.models[0].stages["measure_latency"],
                                                                   result=attrs.evolve(latency, verdict="too_few_samples"))}),))
    row = latency_views.latency_table(thin).rows[0]
    assert row[1].text.endswith(latency_views.PARTIAL) and row[9].text == "too_few_samples"


def test_an_unknown_table_name_lists_every_table():
    from rpx_core.errors import RpxError

    with pytest.raises(RpxError) as error:
        show_text(load_results(RUN_A), "table", ["tier"])
    assert "no table 'tier'; did you mean 'tier1'?" in str(error.value)
    assert all(name in str(error.value) for name in declared.table_views(STAGES))


def test_cli_show_and_its_errors(tmp_path):
    done = subprocess.run([sys.executable, "-m", "rpx_core.cli", "show", str(BATCH), "--format", "markdown"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "### Batch search" in done.stdout
    bad = tmp_path / "not-results.toml"
    bad.write_text("name = 1\n")
    missing = subprocess.run([sys.executable, "-m", "rpx_core.cli", "show", str(tmp_path / "none.toml")],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "no such results file" in missing.stderr
    foreign = subprocess.run([sys.executable, "-m", "rpx_core.cli", "show", str(bad)], capture_output=True, text=True,
                             timeout=120)
    assert foreign.returncode == 2 and "Traceback" not in foreign.stderr, foreign.stderr


def test_a_spec_given_where_results_are_expected_is_named_as_a_spec():
    spec = DATA / "batch.toml"
    for command in (["show", str(spec)], ["plot", str(spec), "--kind", "batch", "-o", "x.png"],
                    ["compare", str(spec), str(BATCH)], ["report", str(spec), "-o", "x.html"]):
        done = subprocess.run([sys.executable, "-m", "rpx_core.cli", *command], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 2 and "Traceback" not in done.stderr, command
        assert f"{spec}: this is a spec (its [[models]] name sources), not a results file: run it with `rpx run " \
            in done.stderr, (command, done.stderr)


#: A unit a header may end with (a word of its own): if it does, every cell must show that unit or a bare number.
HEADER_UNIT = re.compile(r"(?:^|\s)(ns|µs|ms|s|B|kB|MB|GB|TB|bytes|%|FLOP/s|TFLOP/s|FLOP/B|samples/s|frames/s|fps)$")
BARE_NUMBER = re.compile(r"[-+]?\d[\d.,]*( ?[kMGT])?")


def markdown_tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """(headers, rows of cell texts) of every pipe table."""
    found = []
    for block in text.split("### ")[1:]:
        lines = [line for line in block.splitlines() if line.startswith("|")]
        split = [[cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", line)[1:-1]] for line in lines]
        found.append((split[0], split[2:]))
    return found


@pytest.mark.parametrize("source", [RUN_A, BATCH, SERVING])
def test_no_header_unit_contradicts_a_cell_in_any_format(source):
    run = load_results(source)
    every = list(declared.table_views(STAGES))
    markdown = markdown_tables(show_text(run, "markdown", every))
    assert len(markdown) == len(declared.tables(run, STAGES, every)) >= 1
    for headers, rows in markdown:
        for index, header in enumerate(headers):
            unit = HEADER_UNIT.search(header)
            for row in rows:
                cell = row[index]
                if unit and cell != "-":
                    assert BARE_NUMBER.fullmatch(cell) or cell.endswith(f" {unit.group(1)}"), (header, cell)
    terminal = show_text(run, "table", every)
    assert all(header in terminal for headers, _ in markdown for header in headers)
    data = json.loads(show_text(run, "json", every))
    for name, table in data["tables"].items():  # raw values: a column with a unit holds numbers only
        for index, column in enumerate(table["columns"]):
            if column.endswith("]"):
                values = [row[index] for row in table["rows"] if row[index] is not None]
                assert all(isinstance(value, (int, float)) or isinstance(value, list) for value in values), column
    for name in every:
        try:
            rows = list(csv.reader(io.StringIO(show_text(run, "csv", [name]))))
        except RpxError:
            continue  # no figures for that table in this file
        assert rows[0] == data["tables"][name]["columns"]
