"""The roofline stage: lower-bound latency per GPU and precision from the Tier 1 counts."""
