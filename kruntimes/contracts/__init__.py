"""The Temporal-facing contracts, one module per workflow (`run`, `pool`, `host`, `scaleout`,
`cleanup`, `retention`, `scheduled`, `reconcile`): its input, result, signal and query models.
Beside them: the names every party agrees on (`names`: task queues, workflow ids, signal, query
and update names), what activities send a host (`hostcalls`), what a host provider is asked for
and reports (`providers`), and what the worker tells clients (`platform_info`). Pure data: no
client library, no I/O."""
