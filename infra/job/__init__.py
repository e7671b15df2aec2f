"""The training run, rendered from the stack config alone: the trainer's command line, the
PyTorchJob manifest, where its pods may run, the checks that need what is rendered, the
cluster-check workloads and the rule for when a job has started. Pure: the local run and the
offline plan render exactly what `pulumi up` submits.

Also the job on its cluster, reached without pulumi so that the command-line tool shares it
with the program: the kubeconfig the program builds, a small API client, the wait for the
workers to start, and stopping and starting the job."""
