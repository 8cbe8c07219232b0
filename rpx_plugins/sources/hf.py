"""``hf:<model id or local folder>``: a Hugging Face transformers model built from its configuration alone.

The configuration comes from a local folder's ``config.json``, the local Hugging Face cache, or the hub when online;
weights are never downloaded (``AutoModel.from_config`` initialises parameters, and on the meta device, where rpx's
counted stages build, that costs nothing, so a 70B model counts on a laptop). Inputs are token ids of batch x
sequence. The spec's ``config`` table overrides configuration attributes (``num_hidden_layers = 2``); ``kwargs``
take ``auto_class`` (default ``AutoModel``, the model without a task head; e.g. ``AutoModelForCausalLM``) and
``trust_remote_code`` (true or false only: a model folder's own Python runs only when it is ``true``).

Overrides are checked before anything runs, against the configuration class read from source without importing it
(:mod:`rpx_plugins.sources.hf_config`), and again when the model is built, against the configuration itself.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from rpx_core.plugin import InputSpec, ModelSource, RpxError, did_you_mean, import_or_explain, safe_read
from rpx_plugins.sources.hf_config import config_fields, override_problems

SCHEME = "hf"
INSTALL = "pip install 'rpx[hf]' (transformers; weights are never downloaded, only the configuration is read)"
#: Seconds to wait for the hub to answer before calling it unreachable (the hub client's own retries take about a
#: minute to give up without a network).
HUB_TIMEOUT = 1.5


def is_local(target: str) -> bool:
    """A folder path rather than a hub id: written as a path, or an existing folder."""
    return target.startswith((".", "/", "~")) or Path(target).expanduser().is_dir()


@attrs.frozen
class BuildOptions:
    """A ``hf:`` model's ``kwargs`` (checked by type before anything runs: ``"false"`` is not false)."""

    auto_class: str = "AutoModel"  # the transformers auto class building it, e.g. AutoModelForCausalLM
    trust_remote_code: bool = False  # run the model folder's own configuration and modelling code


def check(target: str, config: Mapping[str, Any]) -> list[str]:
    if not is_local(target):
        if cached_config(target) is not None:
            return config_problems(target, config)
        if os.environ.get("HF_HUB_OFFLINE") == "1":
            return [f"{target!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE=1 keeps rpx off the hub "
                    "(give a folder holding config.json, or go online once)"]
        if not hub_reachable():
            return [f"{target!r} is not in the local Hugging Face cache and the hub ({hub_endpoint()}) cannot be reached "
                    f"from here: give a folder holding its config.json (hf:./folder), or go online once "
                    "(HF_HUB_OFFLINE=1 uses the cache alone)"]
        return []
    folder = Path(target).expanduser()
    if not folder.is_dir():
        return [f"no such folder {str(folder.resolve())!r} (a local hf: model is a folder holding config.json)"]
    if not (folder / "config.json").is_file():
        return [f"folder {str(folder.resolve())!r} has no config.json"]
    return config_problems(target, config)


def config_problems(target: str, config: Mapping[str, Any]) -> list[str]:
    """Overrides the configuration does not have, or of the wrong type, as ``config.<key>: ...`` lines; checked
    against the configuration class when this machine has its ``config.json`` (a folder or the cache)."""
    known = known_config(target)
    problems = []
    vocab = config.get("vocab_size")
    if isinstance(vocab, int) and not isinstance(vocab, bool) and vocab < 1:
        problems.append(f"config.vocab_size: must be at least 1 (token ids are drawn from [0, vocab_size)), got {vocab}")
    if known is None:
        return problems
    folder = Path(target).expanduser() if is_local(target) else None
    return problems + override_problems(config, config_fields(known, folder), known)


def hub_endpoint() -> str:
    """The hub's address, as the Hugging Face client reaches it (``HF_ENDPOINT``, else huggingface.co)."""
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


@functools.cache
def hub_reachable() -> bool:
    """Whether the hub answers an HTTP request within HUB_TIMEOUT seconds (asked once per process; any HTTP status
    is an answer), so a machine without a network fails in a second instead of after the hub client's retries."""
    import urllib.error  # here, not at the top: listing plugins need not load the HTTP stack
    import urllib.request

    try:
        urllib.request.urlopen(urllib.request.Request(hub_endpoint(), method="HEAD"), timeout=HUB_TIMEOUT).close()
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError):  # no route, refused, timed out, a TLS failure, a malformed address
        return False
    return True


def known_config(target: str) -> dict[str, Any] | None:
    """The configuration as a plain dict when it is on this machine (a local folder or the cache), read as JSON
    without importing transformers; None when only the hub has it."""
    if is_local(target):
        path: Path | None = Path(target).expanduser() / "config.json"
    else:
        path = cached_config(target)
    try:
        return json.loads(safe_read.read_text(path)) if path is not None else None  # a FIFO never blocks it
    except (OSError, ValueError):
        return None


def cached_config(target: str) -> Path | None:
    """The cached ``config.json`` of a hub id, if the local Hugging Face cache holds it."""
    home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")) / "huggingface"
    hub = Path(os.environ.get("HF_HUB_CACHE") or Path(home) / "hub")  # where huggingface_hub looks, in its order
    snapshots = hub.expanduser() / f"models--{target.replace('/', '--')}" / "snapshots"
    found = sorted(snapshots.glob("*/config.json"), key=lambda p: p.stat().st_mtime) if snapshots.is_dir() else []
    return found[-1] if found else None


def vocab_size(target: str, config: Mapping[str, Any]) -> int | None:
    """The vocabulary token ids are drawn from, when known before the run (a wrong override is ``check``'s to
    report, so it is not read here)."""
    known = known_config(target) or {}
    text = known.get("text_config") if isinstance(known.get("text_config"), dict) else {}
    for size in (config.get("vocab_size"), known.get("vocab_size"), text.get("vocab_size")):
        if isinstance(size, int) and not isinstance(size, bool) and size >= 1:
            return size
    return None


def inputs(target: str, shape: tuple[int, ...], config: Mapping[str, Any]) -> tuple[InputSpec, ...]:
    """Token ids of batch x sequence, drawn from [0, vocab_size) when the vocabulary is known before the run (a
    local folder, the cache or a ``vocab_size`` override), else from {0, 1} (the counts do not depend on the ids)."""
    if len(shape) != 2:
        raise RpxError(f"hf: models take token ids of batch x sequence (e.g. 1x2048), got {'x'.join(map(str, shape))}")
    return (InputSpec(shape=shape, dtype="int64", name="input_ids", high=vocab_size(target, config)),)


def build(target: str, config: Mapping[str, Any], *, auto_class: str = "AutoModel",
          trust_remote_code: bool = False) -> Any:
    """The model from its configuration only, with ``config`` overrides applied and checked. The folder's own code
    runs only when ``trust_remote_code`` is True itself (not a string or a number that reads as true)."""
    if not isinstance(trust_remote_code, bool):
        raise RpxError(f"kwargs.trust_remote_code: expected true or false, got {type(trust_remote_code).__name__} "
                       f"{trust_remote_code!r}")
    transformers = import_or_explain("transformers", SCHEME, INSTALL)
    local = is_local(target)
    location = str(Path(target).expanduser()) if local else target
    offline = not local and (os.environ.get("HF_HUB_OFFLINE") == "1" or not hub_reachable())
    try:
        configuration = transformers.AutoConfig.from_pretrained(location, trust_remote_code=trust_remote_code,
                                                                local_files_only=offline)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        custom = "auto_map" in (known_config(target) or {}) and not trust_remote_code
        hint = "; its configuration is the folder's own code, which rpx runs only with kwargs.trust_remote_code = true"
        raise RpxError(f"hf:{target}: cannot read its configuration: {first}{hint if custom else ''}") from None
    for key, value in config.items():
        if key not in configuration.to_dict() and not hasattr(configuration, key):
            raise RpxError(f"config.{key}: {type(configuration).__name__} has no attribute {key!r}"
                           f"{did_you_mean(key, configuration.to_dict())}")
        try:
            setattr(configuration, key, value)
        except (TypeError, ValueError) as exc:  # transformers' own type checks (strict configurations)
            raise RpxError(f"config.{key}: {str(exc).strip().splitlines()[-1].strip()}") from None
    auto = getattr(transformers, auto_class, None)
    if auto is None or not hasattr(auto, "from_config"):
        raise RpxError(f"kwargs.auto_class: transformers has no auto class {auto_class!r}"
                       f"{did_you_mean(auto_class, [n for n in dir(transformers) if n.startswith('AutoModel')])}")
    return auto.from_config(configuration, trust_remote_code=trust_remote_code)


SOURCE = ModelSource(
    SCHEME,
    "Hugging Face transformers model from its configuration only (model id or local folder; never weights)",
    build=build,
    inputs=inputs,
    requires=("transformers",),
    install=INSTALL,
    check=check,
    kwargs=BuildOptions,
    example="meta-llama/Llama-2-7b-hf",
)
