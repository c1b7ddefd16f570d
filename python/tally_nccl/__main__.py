"""`python -m tally_nccl env|check|path`: the worker's side of tally from a shell.

    eval "$(python -m tally_nccl env --servers srv1:7400,srv2:7400 --provider tcp --token-file /etc/tally/token)"
    python -m tally_nccl check        # exit status 1 when the worker is not ready
    python -m tally_nccl path         # the plugin's absolute path
"""

import argparse
import sys

from . import __version__, check
from ._paths import plugin_path, tally_path
from .env import PROVIDERS, EnvError, nccl_env, shell_block


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m tally_nccl", description="tally's NCCL plugin for PyTorch workers")
    p.add_argument("--version", action="version", version=f"tally_nccl {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)

    e = sub.add_parser("env", help="print the environment NCCL needs, for a shell to eval")
    e.add_argument("--servers", required=True, help="the servers' control addresses, host:port, comma-separated")
    e.add_argument("--provider", choices=PROVIDERS, help="the servers' libfabric provider (default: the plugin's choice)")
    e.add_argument("--token-file", help="file holding the servers' token (read by the shell at eval, never printed)")
    e.add_argument("--iface", help="network interface for libfabric's tcp provider (FI_TCP_IFACE)")
    e.add_argument("--fabric-addr", help="local address the plugin's ncclNet endpoints bind (TALLY_FABRIC_ADDR)")

    c = sub.add_parser("check", help="worker preflight: plugin, libfabric, NCCL, provider, interface, token, servers")
    c.add_argument("--servers", help="default: TALLY_SERVERS")
    c.add_argument("--provider", choices=PROVIDERS, help="default: TALLY_PROVIDER")
    c.add_argument("--nccl-version", help="the NCCL version to judge (default: torch's, else libnccl.so.2's)")
    c.add_argument("--plugin", help="the plugin to load (default: this package's)")
    c.add_argument("--timeout", type=int, default=10, help="seconds to wait for a server (default 10)")

    sub.add_parser("path", help="print the plugin's absolute path and the tally command's")
    args = p.parse_args(argv)

    try:
        if args.cmd == "env":
            env = nccl_env(args.servers, args.provider, args.token_file, args.iface, args.fabric_addr)
            sys.stdout.write(shell_block(env, args.token_file))
            return 0
        if args.cmd == "check":
            failed = check.run(sys.stdout, args.servers, args.provider, args.nccl_version, args.plugin, args.timeout)
            if failed:
                print(f"not ready: {', '.join(failed)} failed", file=sys.stderr)
                return 1
            print("ready")
            return 0
        print(plugin_path())
        print(tally_path() or "tally: not found")
        return 0
    except EnvError as err:
        print(f"tally_nccl: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
