"""LLM-Viewer's published method for a Llama-shaped decoder, recomputed here from its formulas (not its code).

LLM-Viewer (hahnyuan/LLM-Viewer, ``model_analyzer.py`` and ``configs/Llama.py`` at 472f71f, July 2024; the method of
"LLM Inference Unveiled: Survey and Roofline Model Insights", Yuan et al., 2024) describes one decoder layer as a list
of operators, each with OPs and the bytes it loads and stores, and bounds each operator on its own roofline:

* linear layers (q, k, v, o, gate, up, down): OPs = 2 x in x out x tokens, weights loaded once, activations loaded and
  stored per operator, k/v outputs stored as KV cache;
* attention without flash attention: QK^T and SV = 2 x head_dim x heads x tokens x kv_len each, the KV cache loaded
  over kv_len positions at the key/value heads, the scores stored and loaded; softmax 5 OPs per score;
* two norms at 7 OPs per element of the hidden size, two residual adds at 1, the MLP activation at 2 per element of
  the **hidden** size;
* the output head after the layers: OPs = batch x hidden x vocab (MACs: without the factor 2), its weight loaded once,
  one token's activation loaded and the vocabulary's logits stored; the embedding is not counted;
* time = the sum over operators (layers x per-layer operators + the head) of OPs / min(peak, intensity x bandwidth);
  the peak is the INT8 one only when weights, activations and KV cache are all 8-bit or less, else FP16;
* memory = weights of the linear layers (the head and the embedding excluded) + the KV cache stored by the prefill of
  ``seqlen`` tokens + the activations stored by one pass's operators (decode) or the prefill's.

Decode's ``seqlen`` is the KV length the step attends over; prefill's is the prompt. Plain arithmetic, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    layers: int
    vocab: int


@dataclass
class Totals:
    ops: float = 0.0
    matrix_ops: float = 0.0  # the linear layers', QK^T's, SV's and the head's OPs
    load_weight: float = 0.0
    load_act: float = 0.0
    store_act: float = 0.0
    load_kv: float = 0.0
    store_kv: float = 0.0
    time_s: float = 0.0

    @property
    def bytes(self) -> float:
        return self.load_weight + self.load_act + self.store_act + self.load_kv + self.store_kv

    def add(self, ops: float, peak: float, bandwidth: float, times: int = 1, load_weight: float = 0.0,
            load_act: float = 0.0, store_act: float = 0.0, load_kv: float = 0.0, store_kv: float = 0.0,
            matrix: bool = False) -> None:
        """One operator, repeated ``times`` (the layers); its time on its own roofline."""
        moved = load_weight + load_act + store_act + load_kv + store_kv
        performance = min(peak, ops / moved * bandwidth) if moved else peak
        self.ops += ops * times
        self.matrix_ops += ops * times if matrix else 0.0
        self.load_weight += load_weight * times
        self.load_act += load_act * times
        self.store_act += store_act * times
        self.load_kv += load_kv * times
        self.store_kv += store_kv * times
        self.time_s += (ops / performance if ops else 0.0) * times


def analyse(shape: Shape, phase: str, seqlen: int, batch: int, peak: float, bandwidth: float,
            w_byte: float = 2, a_byte: float = 2, kv_byte: float = 2) -> Totals:
    """One prefill of ``seqlen`` tokens or one decode step over ``seqlen`` cached positions, by LLM-Viewer's method."""
    tokens = seqlen if phase == "prefill" else 1
    h, kv_out = shape.hidden, shape.hidden * shape.kv_heads / shape.heads
    head_dim = h // shape.heads
    total = Totals()
    linears = {"q": (h, h), "k": (h, kv_out), "v": (h, kv_out), "o": (h, h), "gate": (h, shape.ffn),
               "up": (h, shape.ffn), "down": (shape.ffn, h)}
    for name, (ic, oc) in linears.items():
        is_kv = name in ("k", "v")
        total.add(2 * ic * oc * batch * tokens, peak, bandwidth, shape.layers, matrix=True, load_weight=ic * oc * w_byte,
                  load_act=ic * batch * tokens * a_byte, store_act=0 if is_kv else oc * batch * tokens * a_byte,
                  store_kv=oc * batch * tokens * kv_byte if is_kv else 0)
    scores = batch * shape.heads * tokens * seqlen
    kv_load = seqlen * head_dim * batch * shape.kv_heads * kv_byte
    if phase == "decode":
        total.add(2 * head_dim * scores, peak, bandwidth, shape.layers, matrix=True,
                  load_act=head_dim * batch * shape.heads * a_byte, store_act=scores * a_byte, load_kv=kv_load)
    else:
        total.add(2 * head_dim * scores, peak, bandwidth, shape.layers, matrix=True,
                  load_act=seqlen * head_dim * batch * shape.kv_heads * a_byte, store_act=scores * a_byte,
                  load_kv=kv_load)
    total.add(2 * head_dim * scores, peak, bandwidth, shape.layers, matrix=True, load_act=scores * a_byte,
              store_act=head_dim * batch * shape.heads * tokens * a_byte, load_kv=kv_load)
    total.add(5 * scores, peak, bandwidth, shape.layers, load_act=scores * a_byte, store_act=scores * a_byte)
    elements = batch * h * tokens
    for ops_per_element, loads in ((7, 1), (7, 1), (1, 1), (1, 1), (2, 2)):  # two norms, two adds, the activation
        total.add(ops_per_element * elements, peak, bandwidth, shape.layers, load_act=loads * elements * a_byte,
                  store_act=elements * a_byte)
    total.add(batch * h * shape.vocab, peak, bandwidth, matrix=True, load_weight=h * shape.vocab * w_byte,
              load_act=h * a_byte, store_act=shape.vocab * a_byte)
    return total


def memory(shape: Shape, seqlen: int, batch: int, w_byte: float = 2, kv_byte: float = 2) -> tuple[float, float]:
    """(weights, KV cache) in bytes as LLM-Viewer's memory footprint counts them."""
    h, kv_out = shape.hidden, shape.hidden * shape.kv_heads / shape.heads
    weights = shape.layers * w_byte * (2 * h * h + 2 * h * kv_out + 3 * h * shape.ffn)
    kv_cache = shape.layers * 2 * kv_out * batch * seqlen * kv_byte
    return weights, kv_cache
