"""`krt`, the command line: `main` maps errors to one line and exit codes, `parser` is the
argument grammar, `commands` the commands (each a thin layer over the SDK), `output` how they
print."""
