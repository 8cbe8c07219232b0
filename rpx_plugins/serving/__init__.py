"""The built-in serving stages: a decoder as it is served, prefill and decode steps against a real KV cache.

``serve`` counts a prefill and decode steps on the meta device (``count``: the model's own forward with a Hugging Face
KV cache object of each length, through rpx's counter), prices weights and KV cache in the formats asked for
(``weights``), and bounds each step on every GPU (``bounds``: time to first token, time per output token, tokens/s,
what fits, where decode turns compute-bound). ``measure_serving`` times the same steps on the backend (``measure``).
``hf_cache`` holds what depends on the transformers version. ``stage`` answers both stages' hooks; their declarations
(tables, figures, charts) are in rpx_plugins.stages.serving.
"""
