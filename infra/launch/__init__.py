"""The run submitted: the PyTorchJob resource (with its namespace and secret) and the
dynamic resource that makes `pulumi up` wait until every worker has started."""
