"""The Pulumi components a run stands on, created by the stack or looked up on an existing
cluster: network, cluster and node groups, IAM, add-ons and operator, autoscaler, storage."""
