"""The `kubetrain` command."""
