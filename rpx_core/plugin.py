"""The public plugin surface: everything an rpx plugin may import, from this one module.

Anything else in ``rpx_core`` and ``rpx_plugins`` is private and may change between releases. The plugin guide
(``docs/plugins.md``) walks through each part: a GPU pack, a backend that overrides one stage, a new stage with
options, and FLOP formulas for operators the counter does not know.

* Hooks: :data:`hookimpl` (with pluggy's ``tryfirst``/``trylast`` to order implementations).
* Registration objects: :class:`Backend` (with :class:`TorchBackend`, the base of the cpu/cuda/mps backends, for a new
  torch accelerator, and :class:`CpuBackend` for variants of the host backend), :class:`Stage` declarations,
  :class:`ModelAdapter` (what ``rpx_register_model_adapters`` returns) and :class:`JaxModel` (what a JAX adapter
  converts to, with the parameter roles ``TRAINABLE``, ``NON_TRAINABLE``, ``BUFFER``; importing it imports no jax),
  :class:`ModelSource` (models by name: ``source = "myzoo:name"``).
* What hooks receive: :class:`StageContext`, :class:`RunContext`, :class:`Job`, :class:`ModelSpec`, :class:`InputSpec`.
* Result and option types of the built-in stages, and the helpers results are built with (:mod:`rpx_core.stats`
  percentiles and the median's interval as :data:`stats`, :class:`MemoryPeak` with :func:`with_start` to fill in a
  region's start and increment, :class:`Timer`).
* Precisions (:class:`Precision`, :func:`get_precision`) and GPU packs (:class:`GPUSpec`, :class:`Peak`,
  :class:`GPUCatalog`).
* Operator formulas: :class:`OpFormula` (what ``rpx_register_op_formulas`` returns) and :mod:`rpx_core.cost_table`
  as :data:`cost_table` (the per-element FLOP costs behind every ``other_flops``).
* Executors: :class:`Executor` (what ``rpx_register_executors`` returns), the :class:`WorkItem` jobs it receives
  with their :class:`Resources`, its :class:`Environment`, :func:`run_task_elsewhere` for the far side of a cluster,
  :class:`Placed` (the node a job ran on) and :func:`failed_records` (a job that could not run).
* Errors: :class:`RpxError` (the user can fix it: one line, exit 2), :class:`UnsupportedError` (a figure cannot be
  produced: said out loud, never a zero), :class:`NotApplicable` (a stage does not apply to this model: recorded as
  not applicable with the reason).
"""

from __future__ import annotations

from rpx_core import cost_table, stats
from rpx_core.adapters import ModelAdapter
from rpx_core.backends import Availability, Backend, MemoryPeak, Timer, with_start
from rpx_core.context import Job, RunContext, StageContext
from rpx_core.errors import NotApplicable, RpxError, UnsupportedError
from rpx_core.gpus import GPUCatalog, GPUSpec, Peak
from rpx_core.hookspecs import hookimpl
from rpx_core.op_formula import OpFormula
from rpx_core.precision import PRECISIONS, Precision, get_precision
from rpx_core.scheduling import Environment, Executor, Resources, WorkItem, run_task_elsewhere
from rpx_core.sources import ModelSource
from rpx_core.spec import InputSpec, ModelSpec
from rpx_core.stages import Stage
from rpx_core.types.batch_search import BatchSearchOptions, BatchSearchResult
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
from rpx_core.worker import Placed, failed_records
from rpx_plugins.jax.model import BUFFER, NON_TRAINABLE, TRAINABLE, JaxModel
from rpx_plugins.torch.backend import TorchBackend
from rpx_plugins.torch.cpu import CpuBackend

__all__ = [
    "hookimpl",
    # registration objects
    "Backend", "TorchBackend", "CpuBackend", "Availability", "Stage", "ModelAdapter", "ModelSource",
    "JaxModel", "TRAINABLE", "NON_TRAINABLE", "BUFFER",
    # what hooks receive
    "StageContext", "RunContext", "Job", "ModelSpec", "InputSpec",
    # results, options and the helpers they are built with
    "ParamsResult", "FlopsResult", "TrafficResult", "OpRecord", "OperatorStats", "ModuleStats", "CountOptions",
    "RooflineResult", "GPURoofline", "RooflineOptions",
    "LatencyResult", "ThroughputResult", "LatencyOptions", "MemoryPeak", "with_start", "Timer", "stats",
    "SystemCard", "AcceleratorCard",
    "BatchSearchResult", "BatchSearchOptions",
    # precisions and GPU packs
    "Precision", "PRECISIONS", "get_precision", "GPUSpec", "Peak", "GPUCatalog",
    # operator formulas
    "OpFormula", "cost_table",
    # executors
    "Executor", "WorkItem", "Resources", "Environment", "run_task_elsewhere", "Placed", "failed_records",
    # errors
    "RpxError", "UnsupportedError", "NotApplicable",
]
