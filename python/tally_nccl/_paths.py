"""Where the wheel put its two binaries.

The plugin lies inside the package (lib/), so its path is known without
LD_LIBRARY_PATH; NCCL_NET_PLUGIN takes that absolute path. `tally` is the
wheel's script, installed into this interpreter's scripts folder (a venv's
bin/, ~/.local/bin with --user), which need not be on PATH.
"""

import os
import shutil
import sysconfig

PLUGIN_NAME = "libnccl-net-tally.so"


def plugin_path():
    """Absolute path of the installed libnccl-net-tally.so (TALLY_NCCL_PLUGIN overrides)."""
    override = os.environ.get("TALLY_NCCL_PLUGIN")
    if override:
        return os.path.abspath(override)
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib", PLUGIN_NAME)


def tally_path():
    """The wheel's `tally` command: this interpreter's scripts folder first, then PATH."""
    # The interpreter's own scheme (a venv's bin/), then pip's --user one.
    for folder in (sysconfig.get_path("scripts"), sysconfig.get_path("scripts", os.name + "_user")):
        candidate = os.path.join(folder or "", "tally")
        if folder and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("tally")
