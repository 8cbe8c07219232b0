"""The liveness of a traced JAX training step, itemised: which values are alive at the step's highest point, and what
each phase allocates and frees.

The jaxpr's own rule (:func:`rpx_plugins.jax.jaxpr.live_peak`): each value an equation creates is held from that
equation to its last use, outputs to the end; a call's peak is its body's. Two things a step adds: outputs written
into donated arguments (the updated parameters and optimiser state, as ``jax.jit(donate_argnums=...)`` lets XLA
alias them) cost nothing on top of the arguments, so they are not counted; and each top-level equation's phase (its
name stack, as the counter reads it) sorts the values alive at the peak into the forward pass's (saved for backward),
the backward pass's (gradients and temporaries) and the optimiser's.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection
from typing import Any

import attrs

from rpx_core.types.training import PHASES, MemoryItem, PhaseMemory
from rpx_plugins.jax.jaxpr import ModuleNaming, live_peak, module_and_phase, subprograms

KINDS = {
    "forward": ("saved_activations", "values the forward pass created, alive at the peak: saved for backward"),
    "backward": ("backward_values", "values the backward pass created: gradients and their temporaries"),
    "optimizer": ("optimizer_temporaries", "values the optimiser's update created (unfused: XLA fuses most)"),
}


@attrs.frozen
class Liveness:
    peak_bytes: int
    at_peak: tuple[MemoryItem, ...]
    peak_phase: str
    peak_operator: str
    peak_position: float
    phases: tuple[PhaseMemory, ...]


def step_liveness(jaxpr: Any, size: Callable[[Any], int], naming: ModuleNaming,
                  donated_outputs: Collection[Any] = ()) -> Liveness:
    """Walk the top-level equations of ``jaxpr`` keeping each created value from its equation to its last use (to
    the end for outputs); ``donated_outputs`` (vars) are written into donated arguments and cost nothing."""
    from jax.extend.core import Var

    eqns = jaxpr.eqns
    last_use = {v: index for index, eqn in enumerate(eqns) for v in eqn.invars if isinstance(v, Var)}
    last_use.update({v: len(eqns) for v in jaxpr.outvars if isinstance(v, Var)})
    donated = set(donated_outputs)
    live: dict[Any, tuple[int, str]] = {}  # var -> (bytes, phase created)
    top, top_at = 0, (0, "forward", "")
    at_top: dict[str, int] = {}
    phase_top: dict[str, int] = defaultdict(int)
    allocated: dict[str, int] = defaultdict(int)
    freed: dict[str, int] = defaultdict(int)
    phase_end: dict[str, int] = {}
    current = "forward"
    for index, eqn in enumerate(eqns):
        phase = module_and_phase(str(eqn.source_info.name_stack), naming)[1]
        if phase != current:
            phase_end[current] = sum(b for b, _ in live.values())
            current = phase
        created = {v: 0 if v in donated else size(v.aval) for v in eqn.outvars}
        inner = max((live_peak(program, size) for program in subprograms(eqn)), default=0)
        during = sum(created.values()) + inner if eqn.primitive.name in ("scan", "while") else max(
            sum(created.values()), inner)
        held = sum(b for b, _ in live.values())
        phase_top[phase] = max(phase_top[phase], held + during)
        if held + during > top:
            top, top_at = held + during, (index, phase, eqn.primitive.name)
            at_top = by_kind(live)
            at_top[phase] = at_top.get(phase, 0) + during
        for v, nbytes in created.items():
            allocated[phase] += nbytes
            if last_use.get(v, -1) > index:
                live[v] = (nbytes, phase)
            else:
                freed[phase] += nbytes
        for v in eqn.invars:
            if isinstance(v, Var) and last_use.get(v) == index and v in live:
                freed[phase] += live.pop(v)[0]
    phase_end[current] = sum(b for b, _ in live.values())
    items = tuple(MemoryItem(KINDS[p][0], at_top[p], KINDS[p][1]) for p in PHASES if at_top.get(p))
    return Liveness(
        peak_bytes=top,
        at_peak=items,
        peak_phase=top_at[1],
        peak_operator=top_at[2],
        peak_position=top_at[0] / max(len(eqns), 1),
        phases=tuple(PhaseMemory(p, phase_top.get(p, 0), allocated[p], freed[p], phase_end.get(p, 0)) for p in PHASES),
    )


def by_kind(live: dict[Any, tuple[int, str]]) -> dict[str, int]:
    totals: dict[str, int] = defaultdict(int)
    for nbytes, phase in live.values():
        totals[phase] += nbytes
    return dict(totals)
