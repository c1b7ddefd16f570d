"""`python -m tally_nccl check`: is this worker ready to all-reduce through tally?

Each check prints one line, `ok`, `warn`, `skip` or `FAIL`, with what it
found and, on failure, what to do. The exit status is 1 when any check
fails. The last check is the real thing: two ranks of this host load the
plugin as NCCL does (`tally bench allreduce --mode agg-plugin`) and run one
all-reduce through the servers with this environment, every element checked,
so a wrong token or provider fails with the server's own words.
"""

import ctypes
import json
import os
import re
import socket
import subprocess

from ._paths import plugin_path, tally_path
from .env import MAX_TOKEN, EnvError, parse_servers

# NCCL 2.19 looks for the v7 tables, the oldest the plugin exports; 2.30 for
# v12, the newest (README.md, "Supported versions").
NCCL_MIN = (2, 19)
NCCL_NEWEST_KNOWN = (2, 30)
# The plugin asks libfabric for the API version of the headers it was built with.
LIBFABRIC_MIN = (1, 17)
# libfabric's name of each provider tally takes (TALLY_PROVIDER's values).
CORE = {"efa": "efa", "tcp": "tcp", "shm": "shm", "tcp-rdm": "tcp"}


class Report:
    """The checks' lines, and whether any failed."""

    def __init__(self, out):
        self.out = out
        self.failed = []

    def line(self, status, name, detail):
        print(f"{status:<4}  {name}: {detail}", file=self.out, flush=True)
        if status == "FAIL":
            self.failed.append(name)


def check_plugin(rep, path):
    """The plugin's file loads as NCCL loads it and exports the tables NCCL looks for."""
    if not os.path.exists(path):
        rep.line("FAIL", "plugin", f"no plugin at {path}: reinstall the wheel (pip install --force-reinstall tally-nccl)")
        return False
    try:
        lib = ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
    except OSError as e:
        msg = str(e)
        if "libfabric" in msg:
            msg += (
                ": the plugin uses the host's libfabric (Debian/Ubuntu: apt-get install libfabric1; "
                "EFA: the AWS EFA installer's, with /opt/amazon/efa/lib on LD_LIBRARY_PATH)"
            )
        elif "GLIBC" in msg:
            msg += ": the plugin needs glibc 2.28 or newer"
        rep.line("FAIL", "plugin", f"{path} does not load: {msg}")
        return False
    missing = [s for s in ("ncclNetPlugin_v11", "ncclCollNetPlugin_v11", "ncclNetPlugin_v7") if not hasattr(lib, s)]
    if missing:
        rep.line("FAIL", "plugin", f"{path} loads but lacks {', '.join(missing)}: not tally's plugin, or a broken copy")
        return False
    rep.line("ok", "plugin", f"{path} loads (ncclNet and ncclCollNet tables v7-v12)")
    return True


def check_libfabric(rep):
    """The libfabric the loader finds, and its version."""
    try:
        fab = ctypes.CDLL("libfabric.so.1")
    except OSError as e:
        rep.line("FAIL", "libfabric", f"not found ({e}): install the host's (Debian/Ubuntu: libfabric1; EFA: the EFA installer's)")
        return
    fab.fi_version.restype = ctypes.c_uint32
    v = fab.fi_version()
    have = (v >> 16, v & 0xFFFF)
    if have < LIBFABRIC_MIN:
        rep.line("FAIL", "libfabric", f"{have[0]}.{have[1]}: the plugin needs {LIBFABRIC_MIN[0]}.{LIBFABRIC_MIN[1]} or newer")
    else:
        rep.line("ok", "libfabric", f"{have[0]}.{have[1]}")


def parse_nccl_version(v):
    """(major, minor, patch) from '2.21.5', a tuple, or NCCL's integer code (22105; 2708 before 2.9)."""
    if isinstance(v, (tuple, list)):
        return tuple(int(x) for x in v[:3])
    if isinstance(v, int):
        return (v // 10000, v % 10000 // 100, v % 100) if v >= 20900 else (v // 1000, v % 1000 // 100, v % 100)
    m = re.fullmatch(r"(\d+)\.(\d+)(?:\.(\d+))?", str(v).strip())
    if not m:
        raise EnvError(f"NCCL version {v!r} is not like 2.21.5")
    return (int(m[1]), int(m[2]), int(m[3] or 0))


def nccl_version():
    """The NCCL this worker runs, and where it was read: torch's, else libnccl.so.2's, else None."""
    try:
        import torch  # noqa: F401 (a training image has it; a login node may not)

        return parse_nccl_version(torch.cuda.nccl.version()), "torch.cuda.nccl.version()"
    except Exception:  # not importable, or built without CUDA
        pass
    try:
        nccl = ctypes.CDLL("libnccl.so.2")
        code = ctypes.c_int(0)
        if nccl.ncclGetVersion(ctypes.byref(code)) == 0:
            return parse_nccl_version(code.value), "libnccl.so.2"
    except (OSError, AttributeError):
        pass
    return None, None


def check_nccl(rep, given):
    if given is not None:
        v, where = parse_nccl_version(given), "--nccl-version"
    else:
        v, where = nccl_version()
    if v is None:
        rep.line("skip", "NCCL", "neither torch nor libnccl.so.2 here to ask; run the check where training runs, or give --nccl-version")
        return
    shown = ".".join(map(str, v))
    if v[:2] < NCCL_MIN:
        rep.line(
            "FAIL",
            "NCCL",
            f"{shown} ({where}) is too old: the plugin's oldest tables are NCCL 2.19's (v7); "
            "NCCL 2.18 and older do not load it (use a PyTorch or nvidia-nccl-cu12 wheel with NCCL 2.19+)",
        )
    elif v[:2] > NCCL_NEWEST_KNOWN:
        rep.line("warn", "NCCL", f"{shown} ({where}) is newer than 2.30, the newest the plugin was tested with")
    else:
        rep.line("ok", "NCCL", f"{shown} ({where})")


def filter_excludes(fi_provider, provider):
    """Whether FI_PROVIDER (names, or ^ and names to exclude) leaves out `provider`'s core provider."""
    v = fi_provider.strip()
    if not v:
        return False
    exclude = v.startswith("^")
    names = {n.strip() for n in re.split(r"[,;]", v.lstrip("^"))}
    return (CORE[provider] in names) == exclude


def check_provider(rep, tally, provider):
    fi = os.environ.get("FI_PROVIDER")
    if provider is None:
        rep.line("warn", "provider", "TALLY_PROVIDER is not set: the plugin takes efa where present, else shm or tcp; set the servers' own")
        return
    if provider not in CORE:
        rep.line("FAIL", "provider", f"TALLY_PROVIDER={provider}: one of efa, tcp, shm, tcp-rdm (the servers' own)")
        return
    if fi is not None and filter_excludes(fi, provider):
        rep.line("FAIL", "provider", f"FI_PROVIDER={fi} in the environment leaves {provider} out: unset FI_PROVIDER, or make it name {CORE[provider]}")
        return
    found = doctor_provider(tally, CORE[provider])
    if found is None:
        rep.line("ok", "provider", f"{provider} (tally doctor not run: no tally command)")
    elif found["status"] == "pass":
        rep.line("ok", "provider", f"{provider}: {found['detail']}")
    else:
        fix = f" ({found['fix']})" if found.get("fix") else ""
        rep.line("FAIL", "provider", f"{provider}: {found['detail']}{fix}; `tally doctor` says more")


def doctor_provider(tally, core):
    """`tally doctor --json`'s check of libfabric provider `core` (None: no tally or no such check)."""
    if tally is None:
        return None
    run = subprocess.run([tally, "doctor", "--json"], capture_output=True, text=True)
    try:
        checks = json.loads(run.stdout)["checks"]
    except (ValueError, KeyError):
        return None
    return next((c for c in checks if c.get("name") == f"provider {core}"), None)


def check_interface(rep):
    iface = os.environ.get("FI_TCP_IFACE")
    addr = os.environ.get("TALLY_FABRIC_ADDR", "").strip()
    if iface and not os.path.exists(f"/sys/class/net/{iface}"):
        have = ", ".join(sorted(os.listdir("/sys/class/net")))
        rep.line("FAIL", "interface", f"FI_TCP_IFACE={iface}: no such interface here (have: {have})")
        return
    if addr:
        try:
            with socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET) as s:
                s.bind((addr, 0))
        except OSError as e:
            rep.line("FAIL", "interface", f"TALLY_FABRIC_ADDR={addr} is not an address of this host ({e.strerror})")
            return
    shown = [f"FI_TCP_IFACE={iface}"] if iface else []
    shown += [f"TALLY_FABRIC_ADDR={addr}"] if addr else []
    rep.line("ok", "interface", ", ".join(shown) if shown else "libfabric's first interface (FI_TCP_IFACE, TALLY_FABRIC_ADDR unset)")


def check_token(rep):
    token = os.environ.get("TALLY_TOKEN")
    if token is None:
        rep.line("warn", "token", "TALLY_TOKEN is not set: only servers without a token admit this worker")
    elif not token.strip():
        rep.line("FAIL", "token", "TALLY_TOKEN is set but empty: set the servers' token, or unset it")
    elif len(token.strip().encode()) > MAX_TOKEN:
        rep.line("FAIL", "token", f"TALLY_TOKEN is {len(token.strip().encode())} bytes: at most {MAX_TOKEN}")
    else:
        rep.line("ok", "token", f"set ({len(token.strip().encode())} bytes; the servers judge it below)")


def check_servers(rep, servers, timeout_s):
    """Each server's control port accepts a connection. Returns the list when all do."""
    try:
        listed = parse_servers(servers or "")
    except EnvError as e:
        rep.line("FAIL", "servers", f"TALLY_SERVERS: {e}")
        return None
    down = []
    for s in listed:
        host, _, port = s.rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
        except OSError as e:
            down.append(f"{s} ({e.strerror or e})")
    if down:
        rep.line("FAIL", "servers", f"not answering: {'; '.join(down)}: is `tally server` running there and the port open?")
        return None
    extra = "" if len(listed) > 1 else " (one server: no failover; two or more recover a lost one)"
    rep.line("ok", "servers", f"{len(listed)} answer on their control ports{extra}")
    return listed


def check_allreduce(rep, tally, plugin, servers, timeout_s):
    """Two ranks load the plugin and all-reduce through the servers with this environment."""
    cmd = [tally, "bench", "allreduce", "--mode", "agg-plugin", "--plugin", plugin, "--servers", ",".join(servers),
           "--ranks", "2", "--sizes", "64K", "--iters", "1", "--warmup", "1"]  # fmt: skip
    env = dict(os.environ, TALLY_JOIN_TIMEOUT_S=str(timeout_s))
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s * 2 + 30)
    except subprocess.TimeoutExpired:
        rep.line("FAIL", "all-reduce", f"no result in {timeout_s * 2 + 30} s: {' '.join(cmd)}")
        return
    if run.returncode == 0:
        rep.line("ok", "all-reduce", "2 ranks through the plugin and every server: every element right")
        return
    # The server's own words (a refused token or provider), once, else tally's error lines.
    said = []
    for ln in run.stderr.splitlines():
        m = re.search(r"remote error: (.*)", ln) or re.match(r"tally: error: (.*)", ln)
        # Two ranks write to one pipe: a line may run into the next one's start.
        text = re.split(r"\s*(?:tally: error: |\[\d{4}-)", m[1])[0] if m else ""
        if text and text not in said and not text.startswith(("ncclCollNet", "rank ")):
            said.append(text)
    said = said or [ln for ln in run.stderr.splitlines() if "error" in ln.lower()][-3:] or ["no error text"]
    rep.line("FAIL", "all-reduce", "; ".join(said))


def run(out, servers=None, provider=None, nccl_version_given=None, plugin=None, timeout_s=10):
    """Every check, printed to `out`; returns the names of those that failed."""
    rep = Report(out)
    plugin = plugin or plugin_path()
    tally = tally_path()
    if tally is None:
        rep.line("FAIL", "tally", "the wheel's tally command is not in this Python's scripts folder nor on PATH")
    plugin_ok = check_plugin(rep, plugin)
    check_libfabric(rep)
    check_nccl(rep, nccl_version_given)
    provider = provider or os.environ.get("TALLY_PROVIDER") or None
    if provider:
        os.environ["TALLY_PROVIDER"] = provider
    check_provider(rep, tally, provider)
    check_interface(rep)
    check_token(rep)
    listed = check_servers(rep, servers or os.environ.get("TALLY_SERVERS"), timeout_s)
    if listed and plugin_ok and tally and not rep.failed:
        check_allreduce(rep, tally, plugin, listed, timeout_s)
    elif listed:
        rep.line("skip", "all-reduce", "not tried: fix the failures above first")
    return rep.failed
