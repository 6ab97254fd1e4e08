"""Names that several components must agree on, each spelled once.

    headers   the invoke API's HTTP headers (gateway and SDK)
    search    the Run workflow's custom search attributes (dev server, workflows, starter, SDK,
              gateway's known-Runs view)
    tokens    the static token file's line format (the gateway's TokenFile, the embedded
              platform's admin token)
    reasons   every stable reason string with its HTTP status or gRPC code, and the `krt-reason`
              trailer (gateway, runtime host, activities, RunWorkflow)
    frames    the invoke port's frame codec and its size rules (gateway and runtime host)

Nothing here does I/O.
"""
