"""Names that several components must agree on, each spelled once.

    headers   the invoke API's HTTP headers (gateway and SDK)
    search    the Run workflow's custom search attributes (dev server, workflows, starter, SDK,
              gateway's known-Runs view)
    tokens    the static token file's line format (the gateway's TokenFile, the embedded
              platform's admin token)

Nothing here does I/O.
"""
