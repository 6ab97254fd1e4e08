"""The Temporal-facing contracts: ids, task queues, and each workflow's, signal's and activity's
input and result model (`lifecycle`); what a host provider is asked for and reports
(`providers`). Pure data: no client library, no I/O."""
