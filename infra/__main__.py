"""The program Pulumi runs (`main: infra/` in Pulumi.yaml); everything lives in infra.program.

A stack file the config model rejects ends the run as a `pulumi.RunError`, which the CLI shows
as its message alone: the list of problems, not a Python traceback around it.
"""

import pulumi

from infra.config import StackConfigError
from infra.program import main

try:
    main()
except StackConfigError as err:
    raise pulumi.RunError(str(err)) from None
