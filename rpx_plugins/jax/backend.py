"""The ``jax`` backend: JAX programs, jitted by XLA, on any device JAX sees (CPU, GPU, TPU), one device or a mesh.

Model convention: the backend runs a :class:`JaxModel` (``apply(params, *inputs, **named_inputs)`` plus ``params``,
any pytree of arrays, each leaf with a role: trainable, non-trainable or buffer). Models as users have them (Flax
linen module + variables, Flax NNX modules, Equinox modules, a Flax ``TrainState``, ``(apply, params)``) become one
through the model adapters of :mod:`rpx_plugins.jax.adapters`; a plugin can register adapters for other libraries.
Params given as ``jax.ShapeDtypeStruct`` leaves are an abstract model: Tier 1 counts it, nothing executes it.

Execution: floating params and inputs are cast to the precision's dtype, and ``apply`` is jitted once. Params keep
the shardings they were given, so a model sharded over a mesh runs on that mesh; arrays the user did not commit to a
device, and inputs on JAX's default device, stay uncommitted, so a ``shard_map`` program moves them to its mesh as it
would outside rpx. JAX dispatches asynchronously: ``call_model`` blocks on the outputs (``block_until_ready``), which
is the synchronisation; ``dispatch_model`` does not, for the pipelined throughput that lets calls overlap.

jax is imported inside functions only: this module is loaded at CLI start, which must stay fast and work without jax.
"""

from __future__ import annotations

import importlib.util
import math
from typing import Any, Callable

import attrs

from rpx_core.plugin import (
    BUFFER,
    NON_TRAINABLE,
    PRECISIONS,
    TRAINABLE,
    Availability,
    Backend,
    BackendUnavailable,
    InputSpec,
    JaxModel,
    MemoryPeak,
    ModelSpec,
    Timer,
    UnsupportedError,
    hookimpl,
    precision_of_dtype,
    with_start,
)
from rpx_plugins.host_memory import HostPeakTracker, is_host_out_of_memory
from rpx_plugins.jax.adapters import BUILTIN

__all__ = ["JaxBackend", "JaxModel", "TRAINABLE", "NON_TRAINABLE", "BUFFER"]

NAME = "jax"
#: The dtype each executable precision stores floating params, inputs and activations in (rpx_core.precision).
EXECUTION_DTYPES = {name: dtype for name, precision in PRECISIONS.items() if (dtype := precision.dtype("jax"))}
#: The dtype floating values are traced at to COUNT each precision (nothing runs): fp8 and int8 are traced at bf16
#: and their floating values sized at 1 byte, as FLOPs do not depend on the dtype and JAX's CPU compiler lacks
#: float8/int8 versions of many primitives.
COUNT_DTYPES = {"fp32": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16", "fp8": "bfloat16",
                "int8": "bfloat16"}
#: Seed of the fixed key every input is drawn from, so runs see the same inputs.
INPUT_SEED = 0
#: How ``read_peak_memory`` describes the device allocator's peak (JAX cannot reset it).
DEVICE_PEAK_RAISED = (
    "device.memory_stats()['peak_bytes_in_use'], raised during the region, so it is the region's peak; start: "
    "memory_stats()['bytes_in_use'] at the reset"
)
DEVICE_PEAK_NOT_RAISED = (
    "no reading: JAX cannot reset device.memory_stats()['peak_bytes_in_use'] and the region did not exceed the "
    "earlier peak, so the region's own peak is unknown"
)
DEVICE_PEAK_NO_REGION = (
    "device.memory_stats()['peak_bytes_in_use'] since process start: no region was started (reset_peak_memory not "
    "called)"
)


@attrs.frozen
class PlacedJaxModel:
    """A model ready to run: ``apply`` jitted once, ``params`` cast, on ``device`` or on the mesh they were given."""

    apply: Callable[..., Any]
    params: Any
    device: Any


def as_jax_model(model: Any) -> JaxModel:
    """A JaxModel, or any form a built-in adapter recognises converted to one (ctx.build_model has already applied
    plugins' adapters); anything else is one line naming the accepted forms."""
    from rpx_core.plugin import adapter_for

    if isinstance(model, JaxModel):
        return model
    adapter = adapter_for(model, BUILTIN)
    if adapter is not None:
        return adapter.adapt(model)
    others = "; ".join(a.form for a in BUILTIN[2:])
    raise UnsupportedError(
        f"backend {NAME!r} runs models given as JaxModel(apply, params) or an (apply, params) tuple, got "
        f"{type(model).__name__} (also accepted: {others})"
    )


def jax_dtype(precision: str) -> Any:
    """The jnp dtype floating tensors take at ``precision``; other precisions are refused out loud."""
    import jax.numpy as jnp

    if precision not in EXECUTION_DTYPES:
        raise UnsupportedError(
            f"backend {NAME!r} cannot run precision {precision!r}; it supports {', '.join(EXECUTION_DTYPES)}"
        )
    return jnp.dtype(EXECUTION_DTYPES[precision])


def count_dtype(precision: str) -> Any:
    """The dtype floating values are traced at to count ``precision`` (see COUNT_DTYPES)."""
    import jax.numpy as jnp

    return jnp.dtype(COUNT_DTYPES[precision])


def is_floating(dtype: Any) -> bool:
    import jax.numpy as jnp

    return bool(jnp.issubdtype(dtype, jnp.floating))


def input_dtype(spec_input: InputSpec, precision: str, counting: bool = False) -> Any:
    """Floating inputs follow the precision (as traced for counting when ``counting``); integer and bool inputs keep
    their dtype, canonicalised by JAX (int64 becomes int32 unless ``jax_enable_x64`` is set, JAX's default)."""
    import jax

    if is_floating(spec_input.dtype):
        return count_dtype(precision) if counting else jax_dtype(precision)
    return jax.dtypes.canonicalize_dtype(spec_input.dtype)


def split_inputs(model: ModelSpec) -> tuple[list[InputSpec], dict[str, InputSpec]]:
    """Positional and named inputs of ``model``; an input_factory is not supported by this backend (yet)."""
    if model.input_factory:
        raise UnsupportedError(
            f"backend {NAME!r} builds inputs from [[models.inputs]] shapes; input_factory is not supported "
            f"(model {model.name!r})"
        )
    return [i for i in model.inputs if i.name is None], {i.name: i for i in model.inputs if i.name is not None}


def resolve_device(device: str) -> Any:
    """``"cpu"``, ``"gpu:1"``, ``"tpu:0"`` (platform[:index among that platform's devices]) or ``"default"``
    (``jax.devices()[0]``) as a jax Device; a device JAX does not have is one clear error."""
    import jax

    platform, _, index_text = device.partition(":")
    problem = f"backend {NAME!r}: device {device!r} is not available"
    try:
        devices = jax.devices(None if platform == "default" else platform)
    except RuntimeError as exc:
        raise BackendUnavailable(f"{problem}: {str(exc).splitlines()[0]}") from None
    if not index_text:
        return devices[0]
    if not index_text.isdigit() or int(index_text) >= len(devices):
        found = f"jax has {len(devices)} {devices[0].platform} device(s), indices 0-{len(devices) - 1}"
        raise BackendUnavailable(f"{problem}: {found}")
    return devices[int(index_text)]


def device_name(device: Any) -> str:
    """``platform:index`` of a jax Device, the index counted among that platform's devices."""
    import jax

    return f"{device.platform}:{jax.devices(device.platform).index(device)}"


def device_peak(stats: dict[str, Any] | None, platform: str, peak_at_reset: int | None,
                start_bytes: int | None = None) -> MemoryPeak:
    """The region's peak from the XLA allocator's statistics (GPU/TPU), which only a region that raised the
    process-wide peak can give; otherwise no figure rather than a stale one. Platforms without them say so."""
    if not stats or "peak_bytes_in_use" not in stats:
        return MemoryPeak(method=f"unsupported: jax reports no peak_bytes_in_use for platform {platform!r}")
    peak = int(stats["peak_bytes_in_use"])
    if peak_at_reset is None:
        return MemoryPeak(method=DEVICE_PEAK_NO_REGION, peak_bytes=peak)
    if peak > peak_at_reset:
        return with_start(MemoryPeak(method=DEVICE_PEAK_RAISED, peak_bytes=peak), start_bytes)
    return MemoryPeak(method=DEVICE_PEAK_NOT_RAISED)


def make_array(spec_input: InputSpec, batch_size: int | None, precision: str, key: Any) -> Any:
    """Standard normal floats, integers uniform in [0, high) (high defaults to 2), bools all False (as torch backends)."""
    import jax
    import jax.numpy as jnp

    shape = spec_input.with_batch(batch_size).shape
    dtype = input_dtype(spec_input, precision)
    if is_floating(dtype):
        return jax.random.normal(key, shape, dtype)
    if dtype == jnp.bool_:
        return jnp.zeros(shape, dtype)
    return jax.random.randint(key, shape, 0, spec_input.high or 2, dtype)


def block(outputs: Any) -> Any:
    """``jax.block_until_ready``, with a fast path for a single array (no import, no tree walk: about 2 us less)."""
    try:
        return outputs.block_until_ready()
    except AttributeError:  # a pytree of outputs
        import jax

        return jax.block_until_ready(outputs)


class BlockingCallTimer(Timer):
    clock = "time.perf_counter around each call; the call blocks until its outputs exist (block_until_ready)"


def no_wait() -> None:
    """JAX's timer synchronisation: nothing, as call_model returns only once its outputs exist."""


def stays_in_place(params: Any, target: Any) -> bool:
    """Whether params run where they are: sharded over several devices, or uncommitted with ``target`` the default
    device (device_put would commit them to one device and keep a mesh program from moving them)."""
    import jax

    leaves = [leaf for leaf in jax.tree.leaves(params) if isinstance(leaf, jax.Array)]
    if any(len(leaf.sharding.device_set) > 1 for leaf in leaves):
        return True
    return target == jax.devices()[0] and not any(leaf.committed for leaf in leaves)


class JaxBackend(Backend):
    """JAX through XLA on one device; see the module docstring for the model convention and synchronisation."""

    name = NAME
    description = "JAX (jit-compiled by XLA) on CPU, GPU or TPU"
    precisions = tuple(EXECUTION_DTYPES)
    framework = "jax"
    worker_preload = ("jax", "jax.numpy")  # imported once before rpx forks workers (no backend is started)
    dispatches_asynchronously = True

    def input_dtype_name(self, spec_input: InputSpec, precision: str) -> str:
        if precision not in EXECUTION_DTYPES:  # counted, never run: the inputs stay as written
            return spec_input.dtype
        return str(input_dtype(spec_input, precision))

    def __init__(self) -> None:
        self._host_peak = HostPeakTracker()
        self._device_peak_at_reset: int | None = None
        self._device_start: int | None = None  # bytes_in_use at the reset

    def probe(self) -> Availability:
        # find_spec first: without jax the probe must not pay for (or fail at) an import.
        if importlib.util.find_spec("jax") is None:
            return Availability(False, "jax is not installed (pip install 'rpx[jax]')")
        import jax

        devices = jax.devices()
        kinds = ", ".join(sorted({d.device_kind for d in devices}))
        plural = "s" if len(devices) > 1 else ""
        return Availability(True, f"jax {jax.__version__}, {devices[0].platform}: {len(devices)} device{plural} ({kinds})")

    def default_device(self) -> str:
        return device_name(resolve_device("default")) if self.availability.available else "default"

    def device_name(self, device: str) -> str | None:
        """The accelerator's name as its runtime reports it ("NVIDIA H200"), so the roofline finds its GPU spec and
        measured figures are set against its bound; None for the host CPU."""
        target = resolve_device(device)
        return None if target.platform == "cpu" else target.device_kind

    def object_precision(self, model: Any) -> str | None:
        """The precision most of a JAX model's floating parameter elements are stored at (fp32, fp16, bf16, fp8);
        None for a form no built-in adapter knows, or a model without floating parameters."""
        import jax

        try:
            leaves = jax.tree.leaves(as_jax_model(model).params)
        except UnsupportedError:
            return None
        elements: dict[str, int] = {}
        for leaf in leaves:
            if hasattr(leaf, "dtype") and is_floating(leaf.dtype):
                elements[leaf.dtype.name] = elements.get(leaf.dtype.name, 0) + math.prod(leaf.shape)
        return precision_of_dtype(max(elements, key=elements.__getitem__)) if elements else None

    def check_device(self, device: str) -> None:
        """Raise BackendUnavailable (one line naming the backend and the reason) unless JAX has ``device``."""
        resolve_device(device)

    def place_model(self, model: Any, precision: str, device: str) -> PlacedJaxModel:
        """Cast floating params in one compiled call (eager casts would compile once per leaf shape) where they are:
        sharded params stay on their mesh, uncommitted ones stay uncommitted on the default device; others go to
        ``device``. ``apply`` is jitted once."""
        import jax

        model = as_jax_model(model)
        dtype = jax_dtype(precision)
        target = resolve_device(device)
        if any(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree.leaves(model.params)):
            raise UnsupportedError(
                f"backend {NAME!r}: the model's params are abstract (jax.ShapeDtypeStruct), so it cannot run"
            )

        def cast(leaf: Any) -> Any:
            return leaf.astype(dtype) if is_floating(leaf.dtype) else leaf

        params = model.params if stays_in_place(model.params, target) else jax.device_put(model.params, target)
        return PlacedJaxModel(jax.jit(model.apply), jax.jit(lambda tree: jax.tree.map(cast, tree))(params), target)

    def make_inputs(
        self, model: ModelSpec, batch_size: int | None, precision: str, device: str
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Inputs from a fixed key; on JAX's default device they stay uncommitted (a mesh program takes them as it
        would outside rpx), on any other device they are committed there."""
        import jax

        positional, named = split_inputs(model)
        target = resolve_device(device)
        keys = iter(jax.random.split(jax.random.key(INPUT_SEED), max(len(model.inputs), 1)))
        args = tuple(make_array(i, batch_size, precision, next(keys)) for i in positional)
        kwargs = {name: make_array(i, batch_size, precision, next(keys)) for name, i in named.items()}
        return (args, kwargs) if target == jax.devices()[0] else jax.device_put((args, kwargs), target)

    def call_model(self, model: PlacedJaxModel, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run the jitted apply and block until its outputs exist: JAX's synchronisation, so each call is complete.
        (``block`` inlined for a single array; an empty ``**kwargs`` is not passed, as it takes jit off its C++ fast
        path: about 4 us per call.)"""
        outputs = model.apply(model.params, *args, **kwargs) if kwargs else model.apply(model.params, *args)
        try:
            return outputs.block_until_ready()
        except AttributeError:  # a pytree of outputs
            return block(outputs)

    def dispatch_model(self, model: PlacedJaxModel, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Enqueue one call without waiting (JAX's async dispatch): the pipelined throughput's unit."""
        return model.apply(model.params, *args, **kwargs) if kwargs else model.apply(model.params, *args)

    def wait_for(self, outputs: Any, device: str) -> None:
        block(outputs)

    def timer(self, device: str) -> Timer:
        """A host clock with nothing to synchronise: every call_model already blocked on its outputs."""
        return BlockingCallTimer(no_wait)

    def reset_peak_memory(self, device: str) -> None:
        target = resolve_device(device)
        if target.platform == "cpu":
            self._host_peak.reset()
            return
        stats = target.memory_stats() or {}
        self._device_peak_at_reset = stats.get("peak_bytes_in_use")
        self._device_start = stats.get("bytes_in_use")

    def read_peak_memory(self, device: str) -> MemoryPeak:
        """CPU: the process's peak RSS (JAX's host buffers live there; memory_stats() is None on CPU). GPU/TPU: the
        XLA allocator's peak_bytes_in_use if the region raised it, else no figure (see DEVICE_PEAK_*)."""
        target = resolve_device(device)
        if target.platform == "cpu":
            return self._host_peak.read()
        return device_peak(target.memory_stats(), target.platform, self._device_peak_at_reset, self._device_start)

    def device_memory_bytes(self, device: str) -> int | None:
        """Host RAM on CPU; the XLA allocator's ``bytes_limit`` on GPU/TPU where the platform reports it."""
        target = resolve_device(device)
        if target.platform == "cpu":
            import psutil

            return psutil.virtual_memory().total
        return (target.memory_stats() or {}).get("bytes_limit")

    def is_out_of_memory(self, exc: BaseException) -> bool:
        """XLA's RESOURCE_EXHAUSTED runtime error, or the host running out (MemoryError)."""
        import jax

        xla_oom = isinstance(exc, jax.errors.JaxRuntimeError) and "RESOURCE_EXHAUSTED" in str(exc)
        return xla_oom or is_host_out_of_memory(exc)


@hookimpl
def rpx_register_backends() -> list[Backend]:
    return [JaxBackend()]


@hookimpl
def rpx_register_model_adapters() -> list[Any]:
    return list(BUILTIN)
