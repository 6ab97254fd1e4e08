"""KRM function evaluation: ResourceList in, ResourceList out, through an Evaluator interface.

    resources    ResourceList YAML and the structured results model
    tags         semver versions and constraints; the rules that pick a binary for a tag
    config       the FunctionConfig kind
    store        the in-memory FunctionConfig store the evaluators read
    directory    FunctionConfigs from a watched directory of YAML files (embedded mode)
    kubernetes   FunctionConfigs from a Kubernetes watch (the only importer of the client)
    errors       the error tree, stable reasons
    evaluation   the request and the answer
    evaluator    the Evaluator interface
    process      running one function process (the one place a process is started)
    executable   the exec evaluator        pod    the pod evaluator's slot (phase 2)
    multi        the chain                 package  reading and writing a KRM package directory
    service      the gRPC FunctionEvaluator servicer     client  its client (RemoteEvaluator)
    cli          `krt fn eval`

Imported only by workers/ (entry points); it imports kruntimes and never the other components.
"""
