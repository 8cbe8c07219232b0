"""The public plugin surface: everything an rpx plugin may import, from this one module.

Anything else in ``rpx_core`` and ``rpx_plugins`` is private and may change between releases. The plugin guide
(``docs/plugins.md``) walks through each part: a GPU pack, a backend that overrides one stage, a new stage with
options and tables, and FLOP formulas for operators the counter does not know. rpx's built-in plugins import from
here too (and from :mod:`rpx_core.types`, the schema of the results they define).

* Hooks: :data:`hookimpl` (with pluggy's ``tryfirst``/``trylast`` to order implementations), and :func:`call_next`
  (inside a stage hook: the answer of the plugins asked after this one, e.g. the built-in one an override adjusts).
* Registration objects: :class:`Backend` (with :class:`TorchBackend`, the base of the cpu/cuda/mps backends, for a new
  torch accelerator, and :class:`CpuBackend` for variants of the host backend: both live with the built-in torch
  plugin and are imported from it when first asked for, so importing this module imports no plugin),
  :class:`Stage` declarations, :class:`ModelAdapter` (what ``rpx_register_model_adapters`` returns) and
  :class:`JaxModel` (what a JAX adapter converts to, with the parameter roles ``TRAINABLE``, ``NON_TRAINABLE``,
  ``BUFFER``; importing it imports no jax), :class:`ModelSource` (models by name: ``source = "myzoo:name"``) with
  :func:`import_or_explain` (a library a source needs, or one line saying how to install it).
* What hooks receive: :class:`StageContext`, :class:`RunContext`, :class:`Job`, :class:`ModelSpec`, :class:`InputSpec`.
* Result and option types of the built-in stages, and the helpers results are built with (:mod:`rpx_core.stats`
  percentiles and the median's interval as :data:`stats`, :class:`MemoryPeak` with :func:`with_start` to fill in a
  region's start and increment, :class:`Timer`, :class:`Deadline` for a stage's own time budget,
  :func:`with_partial` to hand back what an interrupted stage finished, :data:`PROGRESS_INTERVAL`).
* A backend's own breakdown (``measure_breakdown``): :class:`ProfiledCall` of :class:`ProfiledOp` and
  :class:`DeviceActivity` (what ran in one profiled call, from any profiler), :func:`count_calls` (the counter's
  calls of the same call, in order: torch), :class:`Measured` and :class:`Roof` (the call timed without a profiler;
  the local GPU's peaks), and :func:`breakdown_of`, the :class:`BreakdownResult` from them (these live with the
  built-in breakdown plugin and are imported from it on first use).
* How a stage's results are shown (``Stage.tables``, ``figures``, ``charts``): :class:`Table` of :class:`Column`
  and :class:`Cell`, built by a :class:`TableView`; :class:`Figure` (with :class:`Noise`) for ``rpx compare``, the
  traits every model has (:data:`SHAPES`, :data:`PRECISION`); :class:`ChartView` with :func:`pyplot`, :func:`colour` (one colour per GPU or model on every chart) and
  :func:`plain` (a name drawn as text, never as mathtext); :mod:`units`
  (every figure in human units); :func:`ok_result`, :func:`run_result`, :func:`field` to read results files.
* Precisions (:class:`Precision`, ``PrecisionName`` for an option holding precision names, :func:`get_precision`,
  :func:`check_precision`, :func:`precision_of_dtype`, ``BYTES_PER_ELEMENT``) and GPU packs (:class:`GPUSpec`, :class:`Peak`, :class:`GPUCatalog`).
* Validating options as rpx does: the ``batch_size`` / ``batch_sizes`` attrs validators (integers from 1 to 2**31 - 1),
  :func:`one_of` (a named choice, with "did you mean") and :func:`seconds_validator` (durations).
* Operator formulas: :class:`OpFormula` (what ``rpx_register_op_formulas`` returns) and :mod:`rpx_core.cost_table`
  as :data:`cost_table` (the per-element FLOP costs behind every ``other_flops``).
* Executors: :class:`Executor` (what ``rpx_register_executors`` returns), the :class:`WorkItem` jobs it receives
  with their :class:`Resources`, its :class:`Environment`, :func:`run_task_elsewhere` for the far side of a cluster,
  :class:`Placed` (the node a job ran on), :func:`failed_records` (a job that could not run), :func:`usable_cores`
  and :class:`Interrupted` / :func:`signal_of` (SIGINT and SIGTERM as they reach an executor).
* Errors: :class:`RpxError` (the user can fix it: one line, exit 2), :class:`UnsupportedError` (a figure cannot be
  produced: said out loud, never a zero), :class:`NotApplicable` (a stage does not apply to this model: recorded as
  not applicable with the reason), :class:`PluginError`, :class:`BackendUnavailable`, :class:`MissingPeakError`, and
  :func:`did_you_mean` for messages that suggest the closest name.
"""

from __future__ import annotations

import importlib
from typing import Any

from rpx_core import cost_table, safe_read, stats
from rpx_core.convert import batch_size, batch_sizes, one_of
from rpx_core.errors import BackendUnavailable, NotApplicable, PluginError, RpxError, UnsupportedError, did_you_mean
from rpx_core.execution.context import Job, RunContext, StageContext
from rpx_core.execution.executors import Environment, Executor, Resources, WorkItem, run_task_elsewhere, usable_cores
from rpx_core.execution.interrupts import Interrupted, signal_of, with_partial
from rpx_core.execution.progress import INTERVAL as PROGRESS_INTERVAL
from rpx_core.execution.stage_loop import failed_records
from rpx_core.execution.tasks import Placed
from rpx_core.loading import load_callable
from rpx_core.precision import (
    BYTES_PER_ELEMENT,
    PRECISIONS,
    Precision,
    PrecisionName,
    check_precision,
    get_precision,
    precision_of_dtype,
)
from rpx_core.registry.adapters import BUFFER, NON_TRAINABLE, TRAINABLE, JaxModel, ModelAdapter, adapter_for
from rpx_core.registry.backends import Availability, Backend, MemoryPeak, Timer, with_start
from rpx_core.registry.gpus import GPUCatalog, GPUSpec, MissingPeakError, Peak
from rpx_core.registry.hookspecs import hookimpl
from rpx_core.registry.manager import call_next
from rpx_core.registry.op_formula import OpFormula
from rpx_core.registry.sources import ModelSource, import_or_explain
from rpx_core.registry.stages import Stage
from rpx_core.show import units
from rpx_core.show.charts import ChartView, colour, plain, pyplot
from rpx_core.show.compare import PRECISION, SHAPES, Figure, Noise
from rpx_core.show.tables import Cell, Column, Table, TableView, field, ok_result, run_result
from rpx_core.spec.limits import Deadline, seconds_validator
from rpx_core.spec.schema import FLOAT_DTYPES, InputSpec, ModelSpec
from rpx_core.types.batch_search import BatchSearchOptions, BatchSearchResult
from rpx_core.types.breakdown import BreakdownOptions, BreakdownResult, StageCost, TimeRow
from rpx_core.types.counts import (
    CountOptions,
    FlopsResult,
    ModuleStats,
    OperatorStats,
    OpRecord,
    ParamsResult,
    TrafficResult,
)
from rpx_core.types.latency import LatencyOptions, LatencyResult, ThroughputResult
from rpx_core.types.roofline import GPURoofline, RooflineOptions, RooflineResult
from rpx_core.types.system_card import AcceleratorCard, SystemCard

#: Base classes and helpers that live with a built-in plugin, imported from it on first use (importing this module
#: imports no plugin, so a plugin that does not need them never loads the torch plugin's modules).
_FROM_PLUGINS = {"TorchBackend": "rpx_plugins.torch.backend", "CpuBackend": "rpx_plugins.torch.cpu",
                 **dict.fromkeys(("ProfiledCall", "ProfiledOp", "DeviceActivity"), "rpx_plugins.breakdown.trace"),
                 **dict.fromkeys(("breakdown_of", "Measured"), "rpx_plugins.breakdown.attribution"),
                 "Roof": "rpx_plugins.breakdown.rows", "count_calls": "rpx_plugins.breakdown.torch_stage"}


def __getattr__(name: str) -> Any:
    if name in _FROM_PLUGINS:
        return getattr(importlib.import_module(_FROM_PLUGINS[name]), name)
    raise AttributeError(f"module 'rpx_core.plugin' has no attribute {name!r}")


__all__ = [
    "hookimpl", "call_next",
    # registration objects
    "Backend", "TorchBackend", "CpuBackend", "Availability", "Stage", "ModelAdapter", "ModelSource",  # noqa: F822
    "import_or_explain", "JaxModel", "TRAINABLE", "NON_TRAINABLE", "BUFFER", "adapter_for",
    # what hooks receive
    "StageContext", "RunContext", "Job", "ModelSpec", "InputSpec", "FLOAT_DTYPES", "load_callable",
    # results, options and the helpers they are built with
    "ParamsResult", "FlopsResult", "TrafficResult", "OpRecord", "OperatorStats", "ModuleStats", "CountOptions",
    "RooflineResult", "GPURoofline", "RooflineOptions",
    "LatencyResult", "ThroughputResult", "LatencyOptions", "MemoryPeak", "with_start", "Timer", "stats",
    "Deadline", "with_partial", "PROGRESS_INTERVAL", "safe_read",
    "SystemCard", "AcceleratorCard",
    "BatchSearchResult", "BatchSearchOptions",
    "BreakdownResult", "BreakdownOptions", "TimeRow", "StageCost",
    "ProfiledCall", "ProfiledOp", "DeviceActivity", "breakdown_of", "Measured", "Roof", "count_calls",  # noqa: F822
    # how a stage's results are shown
    "Table", "Column", "Cell", "TableView", "Figure", "Noise", "SHAPES", "PRECISION", "ChartView", "pyplot", "colour",
    "plain", "units",
    "ok_result", "run_result", "field",
    # precisions and GPU packs
    "Precision", "PRECISIONS", "PrecisionName", "get_precision", "check_precision", "precision_of_dtype",
    "BYTES_PER_ELEMENT",
    "GPUSpec", "Peak", "GPUCatalog",
    # validating options as rpx does
    "batch_size", "batch_sizes", "one_of", "seconds_validator",
    # operator formulas
    "OpFormula", "cost_table",
    # executors
    "Executor", "WorkItem", "Resources", "Environment", "run_task_elsewhere", "Placed", "failed_records",
    "usable_cores", "Interrupted", "signal_of",
    # errors
    "RpxError", "UnsupportedError", "NotApplicable", "PluginError", "BackendUnavailable", "MissingPeakError",
    "did_you_mean",
]
