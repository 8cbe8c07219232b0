"""Which counted call each profiled operator call is: the join of measured time with counted work.

The key is the operator's name and its tensor inputs' shapes, in call order: both sequences are the same program's
operators at the same (dispatch) level, so they are aligned like two texts, with the fewest insertions and deletions
(:func:`common_pairs`). Calls whose name and shapes agree are matched first; between two such anchors, the calls left
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
    if full_p == full_c:  # the usual case, counted on the device it was profiled on: no alignment to search
        return list(range(len(profiled)))
    matched: list[int | None] = [None] * len(profiled)
    anchors = [(-1, -1), *common_pairs(full_p, full_c), (len(full_p), len(full_c))]
    for (p_last, c_last), (p_next, c_next) in zip(anchors, anchors[1:]):
        if p_last >= 0:
            matched[p_last] = c_last
        gap_p = [family for family, _ in full_p[p_last + 1 : p_next]]
        gap_c = [family for family, _ in full_c[c_last + 1 : c_next]]
        if gap_p and gap_c:  # the same place, other shapes: match by name within the gap
            for i, j in common_pairs(gap_p, gap_c):
                matched[p_last + 1 + i] = c_last + 1 + j
    return matched


#: Beyond this many insertions and deletions, the alignment falls back to difflib's (faster, not always the fewest).
MAX_EDITS = 1000


def common_pairs(first: Sequence, second: Sequence) -> list[tuple[int, int]]:
    """Index pairs (i, j), in order, of a longest common subsequence of ``first`` and ``second``: the alignment with
    the fewest insertions and deletions (Myers' O((N + M) D) algorithm, D the edits). The fewest edits matter here:
    a model repeats its layers, and an alignment that merely finds long common blocks (difflib) can pair a call with
    the same call of the next layer. Beyond MAX_EDITS edits, difflib's blocks."""
    n, m = len(first), len(second)
    frontier = {1: 0}  # diagonal k = x - y -> the furthest x reached on it
    history = []
    for edits in range(min(n + m, MAX_EDITS) + 1):
        history.append(dict(frontier))
        for k in range(-edits, edits + 1, 2):
            down = k == -edits or (k != edits and frontier[k - 1] < frontier[k + 1])
            x = frontier[k + 1] if down else frontier[k - 1] + 1
            y = x - k
            while x < n and y < m and first[x] == second[y]:
                x, y = x + 1, y + 1
            frontier[k] = x
            if x >= n and y >= m:
                return _pairs_back(history, n, m)
    blocks = difflib.SequenceMatcher(None, first, second, autojunk=False).get_matching_blocks()
    return [(i + offset, j + offset) for i, j, size in blocks for offset in range(size)]


def _pairs_back(history: list[dict[int, int]], n: int, m: int) -> list[tuple[int, int]]:
    """The matched pairs of the path Myers' search found, walked back from the end."""
    x, y = n, m
    pairs = []
    for edits in range(len(history) - 1, -1, -1):
        frontier = history[edits]
        k = x - y
        down = k == -edits or (k != edits and frontier[k - 1] < frontier[k + 1])
        previous_k = k + 1 if down else k - 1
        previous_x = frontier[previous_k]
        previous_y = previous_x - previous_k
        while x > previous_x and y > previous_y:
            x, y = x - 1, y - 1
            pairs.append((x, y))
        x, y = previous_x, previous_y
    return pairs[::-1]


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
