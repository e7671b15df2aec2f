"""The program `pulumi up` runs; the architecture itself reads top-down in `infra/program.py`.

It sits at the project root, and Pulumi.yaml names no `main`, because the engine starts every
resource plugin in the `main` directory: our image build's dynamic provider included. There the
provider's launcher looks for `.venv` (uv creates it here, beside uv.lock) and Python puts
that directory first on sys.path (the provider is unpickled by reference to
`infra.image.build`). tests/infra/test_engine_layout.py holds those engine rules, with sources.

A stack file the config model rejects ends the run as a `pulumi.RunError`, which the CLI shows
as its message alone (the list of problems), not a Python traceback around it.
"""

import pulumi

from infra.config import StackConfigError
from infra.program import main

try:
    main()
except StackConfigError as err:
    raise pulumi.RunError(str(err)) from None
