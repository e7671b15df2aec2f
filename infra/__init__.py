"""The Pulumi program, in wings that record its layers (lowest first).

Pure wings (no pulumi, no torch; the local run and the plan import them):
  facts/      instance, EKS-version and price tables
  config/     the stack schema: one typed model of a stack file, its loaders and its errors
  estimates/  what the stack will need and cost: memory fit, duration, cost, and the run plan
  job/        the training run rendered: trainer flags, PyTorchJob manifest, GPU placement,
              whole-stack checks, cluster-check manifests, the start rule and wait, and the
              job on its cluster: kubeconfig, API client, stop and start
Pulumi wings:
  platform/   the components a run stands on: network, cluster, GPU nodes, IAM, add-ons,
              operator, autoscaler, storage, bucket, run access, GPU lease, capacity block
  image/      the trainer image: its source, the CodeBuild build, the component
  launch/     the job resource and its start watch
  offline/    the SDK's mock runtime, to evaluate the program without an engine
program.py    the architecture: one stack config in, one training run's resources out
policy/       the guardrail policy pack, over what the program registers

A wing imports only wings listed above it here (tests/test_architecture.py holds this).
`image_build.py` and `job_watch.py` at this level only re-export dynamic providers under the
module paths that deployed stacks pickled them at.
"""
