"""What the platform is configured with, read once at an entry point: `runtimes` (runtimes,
tenants, pool limits) and `secret_store` (the embedded platform's secrets a Run's `envFrom`
names)."""
