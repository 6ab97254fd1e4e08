"""What the platform is configured with, read once at an entry point: `runtimes` (runtimes,
tenants, pool limits), `secret_store` (the embedded platform's secrets a Run's `envFrom`
names) and `bindings` (who may invoke, and whose Runs may use secrets, per namespace)."""
