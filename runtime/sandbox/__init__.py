"""Function isolation: what a function process may see, reach and use (policy describes it).

syscalls   the Linux calls Python does not expose (unshare, setns, mount, prctl)
fsview     the function's view of the file system: kept paths shown, the rest hidden
identity   one unprivileged uid per function, unique on the machine
cgroups    memory and process limits across all of a function's processes
child      what the zygote's child does to become a sandboxed function process
policy     the settings, and what is in force on this host
shared_tmp the scratch directories functions share without mount namespaces, made sticky
"""
