"""The `stalwart` command line."""
