"""rpx beside fvcore, ptflops, thop, calflops, DeepSpeed, FlopCounterMode, torch.utils.benchmark and pyperf.

``models`` (the model set with hand-derived figures) needs only torch and transformers, so the test suite imports it;
the rest runs inside the comparison's own environment (``run.py`` creates it).
"""
