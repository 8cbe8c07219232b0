"""measure_breakdown: where one call's time goes, each operator and module measured against its own bound.

One concern per module: ``trace`` (a chrome trace read: each call's operators at the level the counter sees, its
device work and the operator that launched each piece), ``matching`` (profiled operators joined to the counter's
calls of the same call), ``rows`` (device time shared out, idle gaps, the tables and their bounds), ``attribution``
(the result from a trace and counted calls: the entry point for live and saved profiles alike), ``torch_ops`` (what
torch's dispatcher says about an operator name), ``torch_stage`` (the torch hook: warm-up, reference calls, the
counted pass, the profiled calls), ``jax_stage`` (the jax hook: which compiled kernels mix operations, and so why
there is no per-operation time). Only ``torch_ops`` and ``torch_stage`` import torch, inside the stage.
"""
