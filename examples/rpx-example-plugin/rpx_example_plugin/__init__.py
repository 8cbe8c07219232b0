"""An example third-party rpx plugin; see plugin.py."""
