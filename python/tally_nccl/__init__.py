"""tally for PyTorch and NCCL jobs: the plugin's path and the environment NCCL needs.

The wheel holds the `tally` command (installed beside this Python's scripts)
and libnccl-net-tally.so (inside this package); libfabric stays the host's,
so that an EFA host's own libfabric is the one the plugin loads.

    import os, tally_nccl
    os.environ.update(tally_nccl.nccl_env(["srv1:7400", "srv2:7400"], provider="tcp"))
    # ... then torch.distributed.init_process_group("nccl")

From a shell: `eval "$(python -m tally_nccl env --servers srv1:7400,srv2:7400)"`,
and `python -m tally_nccl check` before the job (the worker preflight).
"""

from ._paths import plugin_path, tally_path
from .env import nccl_env, shell_block

__all__ = ["plugin_path", "tally_path", "nccl_env", "shell_block", "__version__"]

# Written by scripts/build/wheel.py from the workspace's version; "dev" in a checkout.
try:
    from ._version import __version__
except ImportError:  # a source checkout, not a built wheel
    __version__ = "dev"
