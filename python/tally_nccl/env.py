"""The environment a worker's NCCL needs to all-reduce through tally servers.

What docs/nccl.md section 3 has users write by hand, made from a server list:
the plugin by absolute path (no LD_LIBRARY_PATH), `NCCL_NET=Tally` so that a
plugin that fails to load fails the communicator instead of letting NCCL run
on its own transport unnoticed, CollNet enabled, the servers, the provider
and the token. A value of None means "unset this variable".
"""

import shlex

from ._paths import plugin_path

PROVIDERS = ("efa", "tcp", "shm", "tcp-rdm")
MAX_SERVERS = 256  # as the plugin's client refuses more
MAX_TOKEN = 32  # bytes, as servers and clients refuse longer


class EnvError(ValueError):
    """Input the environment cannot be made from; the message names it."""


def parse_servers(servers):
    """`host:port` strings (a list, or one string split on commas and spaces), checked as the plugin does."""
    if isinstance(servers, str):
        servers = servers.replace(",", " ").split()
    out = []
    for s in servers:
        host, sep, port = s.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise EnvError(f"server {s!r} is not host:port (port 1-65535), e.g. srv1:7400")
        if s in out:
            raise EnvError(f"server {s} is listed twice: every rank would join it once per copy")
        out.append(s)
    if not out:
        raise EnvError("no servers: give at least one host:port (two or more for failover)")
    if len(out) > MAX_SERVERS:
        raise EnvError(f"{len(out)} servers: at most {MAX_SERVERS}")
    return out


def read_token(token_file):
    """The token in `token_file` (surrounding whitespace dropped), checked as a server would."""
    try:
        with open(token_file, "rb") as f:
            token = f.read().strip()
    except OSError as e:
        raise EnvError(f"token file {token_file}: {e.strerror}") from None
    if not token:
        raise EnvError(f"token file {token_file} is empty")
    if len(token) > MAX_TOKEN:
        raise EnvError(f"token in {token_file} is {len(token)} bytes: at most {MAX_TOKEN}")
    return token.decode("utf-8", "replace")


def nccl_env(servers, provider=None, token_file=None, iface=None, fabric_addr=None, plugin=None):
    """The variables, as a dict (None: unset), for NCCL to run all-reduce through `servers`.

    provider: the servers' (`provider` in their configuration): efa, tcp, shm
    or tcp-rdm; None leaves the plugin's choice (efa where present, else shm
    or tcp). token_file: the servers' token. iface: the network interface
    libfabric's tcp provider uses (FI_TCP_IFACE); fabric_addr: the local
    address the plugin's ncclNet endpoints bind (TALLY_FABRIC_ADDR).
    """
    env = {
        "NCCL_NET_PLUGIN": plugin or plugin_path(),
        "NCCL_NET": "Tally",
        "NCCL_COLLNET_ENABLE": "1",
        "TALLY_SERVERS": ",".join(parse_servers(servers)),
    }
    if provider is not None:
        if provider not in PROVIDERS:
            raise EnvError(f"provider {provider!r}: one of {', '.join(PROVIDERS)} (the servers' own)")
        env["TALLY_PROVIDER"] = provider
        if provider != "efa":
            # An EFA template's FI_PROVIDER=efa would hide tcp and shm from libfabric.
            env["FI_PROVIDER"] = None
    if token_file is not None:
        env["TALLY_TOKEN"] = read_token(token_file)
    if iface is not None:
        env["FI_TCP_IFACE"] = iface
    if fabric_addr is not None:
        env["TALLY_FABRIC_ADDR"] = fabric_addr
    return env


def shell_block(env, token_file=None):
    """`env` as lines a POSIX shell can eval; the token is read from its file there, never printed."""
    lines = []
    for name, value in env.items():
        if value is None:
            lines.append(f"unset {name}")
        elif name == "TALLY_TOKEN" and token_file is not None:
            lines.append(f'export TALLY_TOKEN="$(cat {shlex.quote(token_file)})"')
        else:
            lines.append(f"export {name}={shlex.quote(value)}")
    return "\n".join(lines) + "\n"
