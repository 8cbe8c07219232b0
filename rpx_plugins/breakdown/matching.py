"""Which counted call each profiled operator call is: the join of measured time with counted work.

The key is the operator's name and its tensor inputs' shapes, in call order: both sequences are the same program's
operators at the same (dispatch) level, so they are aligned like two texts (:class:`difflib.SequenceMatcher`, every
element significant). Calls whose name and shapes agree are matched first; between two such anchors, the calls left
over are matched by name alone, in order (a profile that recorded no shapes, or a list argument recorded
differently). A call matched on neither side stays unmatched and is reported, never guessed.

Operators that do the same work under another name on another device match each other (:data:`FAMILIES`): a count
made on the meta device or the CPU sees ``_scaled_dot_product_flash_attention_for_cpu`` where a GPU runs the cuDNN or
flash kernel, and ``_native_batch_norm_legit_no_training`` where it runs ``cudnn_batch_norm``; the counter prices
each family with one formula. Their shapes are compared on the leading tensors the family shares (query, key and
value; the batch norm's input).

Pure functions over names and shape strings: no torch.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence

#: name -> (family, how many leading tensor shapes the family's members share)
FAMILIES: dict[str, tuple[str, int]] = {
    **dict.fromkeys(
        ("aten._scaled_dot_product_flash_attention", "aten._scaled_dot_product_efficient_attention",
         "aten._scaled_dot_product_cudnn_attention", "aten._scaled_dot_product_flash_attention_for_cpu",
         "aten._scaled_dot_product_fused_attention_overrideable"),
        ("attention", 3),
    ),
    **dict.fromkeys(
        ("aten.native_batch_norm", "aten._native_batch_norm_legit", "aten._native_batch_norm_legit_no_training",
         "aten.cudnn_batch_norm", "aten.miopen_batch_norm"),
        ("batch_norm", 1),
    ),
}

_SHAPE = re.compile(r"\[[^\]]*\]")


def shapes_of(inputs: str) -> tuple[str, ...]:
    """The shapes of a counted call's inputs: "bfloat16[2048,4096], int64[1,2048]" -> ("[2048,4096]", "[1,2048]")."""
    return tuple(_SHAPE.findall(inputs))


def key(name: str, shapes: Sequence[str]) -> tuple[str, tuple[str, ...]]:
    """What two calls must share to be the same call: the operator (or its family) and its input shapes."""
    family, arity = FAMILIES.get(name, (name, None))
    return family, tuple(shapes[:arity] if arity is not None else shapes)


def align(profiled: Sequence[tuple[str, Sequence[str]]], counted: Sequence[tuple[str, Sequence[str]]]
          ) -> list[int | None]:
    """For each profiled call (name, shapes), the index of the counted call it is, or None."""
    full_p = [key(name, shapes) for name, shapes in profiled]
    full_c = [key(name, shapes) for name, shapes in counted]
    matched: list[int | None] = [None] * len(profiled)
    for tag, p_from, p_to, c_from, c_to in _opcodes(full_p, full_c):
        if tag == "equal":
            for offset in range(p_to - p_from):
                matched[p_from + offset] = c_from + offset
        elif tag == "replace":  # same place, different shapes: match by name within the gap
            names_p = [family for family, _ in full_p[p_from:p_to]]
            names_c = [family for family, _ in full_c[c_from:c_to]]
            for inner, i_from, i_to, j_from, _ in _opcodes(names_p, names_c):
                if inner == "equal":
                    for offset in range(i_to - i_from):
                        matched[p_from + i_from + offset] = c_from + j_from + offset
    return matched


def _opcodes(first: list, second: list) -> list[tuple[str, int, int, int, int]]:
    return difflib.SequenceMatcher(None, first, second, autojunk=False).get_opcodes()


def fill_modules(modules: Sequence[str | None], root: str) -> list[str]:
    """Module paths for every call, given those of matched calls (None: unmatched). Module calls nest in time, so an
    unmatched call between two matched ones ran inside every module enclosing both: the deepest such is the common
    prefix of their paths (``root`` when they share none, or at either end of the call)."""
    known = [index for index, module in enumerate(modules) if module is not None]
    filled: list[str] = []
    after = 0
    for index, module in enumerate(modules):
        if module is not None:
            filled.append(module)
            continue
        while after < len(known) and known[after] < index:
            after += 1
        before_module = modules[known[after - 1]] if after > 0 else None
        after_module = modules[known[after]] if after < len(known) else None
        filled.append(_common_path(before_module, after_module, root))
    return filled


def _common_path(first: str | None, second: str | None, root: str) -> str:
    if first is None or second is None or root in (first, second):
        return root
    common = []
    for a, b in zip(first.split("."), second.split(".")):
        if a != b:
            break
        common.append(a)
    return ".".join(common) or root
