"""Language adapters: how a handler is loaded and called inside a function process."""

ADAPTERS = ("python", "bash", "krm")  # krm: kruntimes.runtime.krm_adapter, an entrypoint per call
