"""From a spec file to a plan: the spec's schema, sweeps expanded into jobs, the plan (stage order, options, one
Job per model or sweep point), and every check ``rpx validate`` makes before anything runs, reported at once."""
