"""One module per ``rpx`` command beyond the core ones; ``rpx_core.cli`` only registers them. Each module has
``register(command)``, where ``command(name, help)`` returns the command's argparse parser."""
