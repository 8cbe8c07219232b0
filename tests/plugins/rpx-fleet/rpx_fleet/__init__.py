"""An rpx plugin for a fleet of edge devices (a test of the plugin guide: see plugin.py)."""
