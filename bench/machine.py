"""The machine line every benchmark prints, so recorded numbers always say where they were measured."""

from __future__ import annotations

import os
import platform


def describe_machine() -> str:
    from rpx_plugins.system_card import cpu_model_name

    return f"{cpu_model_name()} | {os.cpu_count()} logical CPUs | Python {platform.python_version()} | {platform.platform()}"
