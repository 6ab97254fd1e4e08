"""The control plane's decisions as pure functions, called by the workflows: `scheduling`
(admission, placement, tenancy), `runlife` (a Run's timing), `hostlife` (a host's lifecycle),
`reconciling` (what is orphaned). No clock, no Temporal, no I/O."""
