"""The training run, rendered from the stack config alone: the trainer's command line, the
PyTorchJob manifest, where its pods may run, the checks that need what is rendered, the
cluster-check workloads and the rule for when a job has started. Pure: the local run and the
offline plan render exactly what `pulumi up` submits."""
