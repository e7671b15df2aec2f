"""What the `fsdp-eks` commands share: the stack argument, errors, tools, the stack's outputs,
its cluster and its run. Nothing here is a command."""
