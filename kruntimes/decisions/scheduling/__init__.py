"""The scheduling decision layer: pure data and pure functions, no Temporal, no I/O.

``model`` holds hosts, reservations, requests and decisions; ``admission`` decides; ``failures``
describes what host providers report. RuntimePoolWorkflow and ScaleOutWorkflow call these; each
is imported from its own module (the package re-exports nothing).
"""
