"""The Pulumi program, in wings that record its layers (lowest first).

Pure wings: facts, config, estimates, job. Pulumi wings: platform, image, launch, offline;
then program.py (the architecture) and policy/ (the guardrail pack). A wing imports only
wings listed before it (tests/test_architecture.py holds this).
Each wing, and the re-exporting modules at this level: docs/design/program.md#infra-package
"""
