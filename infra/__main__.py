"""The program Pulumi runs (`main: infra/` in Pulumi.yaml); everything lives in infra.program."""

from infra.program import main

main()
