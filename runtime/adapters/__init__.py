"""Language adapters: how a handler is loaded and called inside a function process."""

ADAPTERS = ("python", "bash")
