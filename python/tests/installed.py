"""The installed wheel on its own: run by scripts/build/test-wheel.sh with a fresh venv's python.

Everything comes from the installed copy (the venv's `tally`, the package's
plugin): `tally --version`; `python -m tally_nccl env` evaluated by a shell;
two tcp servers with a token started from the installed `tally`; the
preflight passing against them, then failing, each with its reason, on: no
plugin, NCCL too old, wrong provider, wrong token, a server down; and
all-reduces through both servers by tally's client and by the installed
plugin, every element checked (`tally bench` exits 1 on a wrong one).
"""

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

import tally_nccl

VENV = sys.prefix
TOKEN = "wheel-test-token"


def fail(msg):
    sys.exit(f"test-wheel: FAIL: {msg}")


def run(cmd, env=None, expect=0):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if expect is not None and r.returncode != expect:
        fail(f"{' '.join(cmd)}: exit {r.returncode}, expected {expect}\n{r.stdout}\n{r.stderr}")
    return r


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(tally, port, core, env):
    cmd = [tally, "server", "--listen", f"127.0.0.1:{port}", "--lcores", str(core), "--provider", "tcp",
           "--slab-size", "16M", "--hugepages", "off", "--max-jobs", "4", "--max-ranks", "16"]  # fmt: skip
    log = tempfile.TemporaryFile(mode="w+")
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if p.poll() is not None:
            log.seek(0)
            fail(f"server on {port} exited {p.returncode}:\n{log.read()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return p
        except OSError:
            time.sleep(0.2)
    fail(f"server on {port} not listening after 60 s")


def preflight(env, *args):
    return run([sys.executable, "-m", "tally_nccl", "check", *args], env=env, expect=None)


def expect_check_fails(name, env, args, line):
    r = preflight(env, *args)
    if r.returncode != 1 or not re.search(line, r.stdout, re.M):
        fail(f"check with {name}: exit {r.returncode}, expected 1 and a line matching {line!r}:\n{r.stdout}\n{r.stderr}")
    print(f"test-wheel: check fails on {name}: {next(l for l in r.stdout.splitlines() if re.search(line, l))}")


def main():
    plugin = tally_nccl.plugin_path()
    tally = tally_nccl.tally_path()
    for what, path in (("tally_nccl", tally_nccl.__file__), ("plugin", plugin), ("tally", tally)):
        if not path or not os.path.realpath(path).startswith(os.path.realpath(VENV) + os.sep):
            fail(f"{what} at {path}, not from the venv {VENV}")
    version = run([tally, "--version"]).stdout.strip()
    if version != f"tally {tally_nccl.__version__}":
        fail(f"tally --version says {version!r}, the package {tally_nccl.__version__}")
    print(f"test-wheel: {version} at {tally}, plugin {plugin}")

    base = {k: v for k, v in os.environ.items() if not k.startswith(("TALLY_", "NCCL_", "FI_"))}
    ports = [free_port(), free_port()]
    servers = ",".join(f"127.0.0.1:{p}" for p in ports)

    # The env block, as a user evaluates it (the token read from its file by the shell).
    with tempfile.NamedTemporaryFile("w", suffix=".token") as tf:
        tf.write(TOKEN + "\n")
        tf.flush()
        block = run([sys.executable, "-m", "tally_nccl", "env", "--servers", servers, "--provider", "tcp",
                     "--token-file", tf.name], env=base).stdout  # fmt: skip
        if TOKEN in block:
            fail(f"the env block prints the token:\n{block}")
        shown = run(["bash", "-c", block + "env"], env=dict(base, FI_PROVIDER="efa")).stdout
    got = dict(l.split("=", 1) for l in shown.splitlines() if "=" in l)
    want = {"NCCL_NET_PLUGIN": plugin, "NCCL_NET": "Tally", "NCCL_COLLNET_ENABLE": "1", "TALLY_SERVERS": servers,
            "TALLY_PROVIDER": "tcp", "TALLY_TOKEN": TOKEN}  # fmt: skip
    for k, v in want.items():
        if got.get(k) != v:
            fail(f"after eval of the env block {k}={got.get(k)!r}, expected {v!r}:\n{block}")
    if "FI_PROVIDER" in got:
        fail("the env block for tcp leaves an inherited FI_PROVIDER set")
    r = run([sys.executable, "-m", "tally_nccl", "env", "--servers", "a:7400,a:7400"], env=base, expect=1)
    if "listed twice" not in r.stderr:
        fail(f"a repeated server: {r.stderr}")
    worker = {k: v for k, v in got.items() if k in want}
    worker = dict(base, **worker)
    print("test-wheel: env block evaluated: " + " ".join(f"{k}={worker[k]}" for k in want if k != "TALLY_TOKEN"))

    procs = []
    try:
        server_env = dict(base, TALLY_TOKEN=TOKEN)
        procs = [start_server(tally, p, i % 2, server_env) for i, p in enumerate(ports)]

        r = preflight(worker, "--nccl-version", "2.21.5")
        if r.returncode != 0 or not r.stdout.rstrip().endswith("ready"):
            fail(f"check against running servers: exit {r.returncode}\n{r.stdout}\n{r.stderr}")
        print("test-wheel: check passes: " + "; ".join(l.split(":")[0].split()[-1] for l in r.stdout.splitlines()[:-1]))

        # Through both servers: tally's client (agg) and the installed plugin (agg-plugin).
        r = run([tally, "bench", "allreduce", "--servers", servers, "--mode", "agg,agg-plugin", "--plugin", plugin,
                 "--ranks", "2", "--sizes", "4K,1M", "--dtype", "bf16", "--iters", "2", "--warmup", "1"], env=worker)  # fmt: skip
        rows = [l.split() for l in r.stdout.splitlines() if l.split()[:1] in (["agg"], ["agg-plugin"])]
        if len(rows) != 4 or any(row[-1] != "0" for row in rows):
            fail(f"all-reduce rows: {rows}\n{r.stdout}")
        print(f"test-wheel: {len(rows)} all-reduce sizes x modes through 2 servers (bf16 sum), #wrong 0 in each")

        expect_check_fails("no plugin", worker, ["--plugin", os.path.join(VENV, "nothing", "libnccl-net-tally.so")], r"^FAIL  plugin: no plugin at ")
        expect_check_fails("NCCL 2.18", worker, ["--nccl-version", "2.18.3"], r"^FAIL  NCCL: 2\.18\.3 .* too old")
        expect_check_fails("wrong provider", worker, ["--provider", "shm"], r"^FAIL  all-reduce: .*same provider")
        expect_check_fails("FI_PROVIDER=efa", dict(worker, FI_PROVIDER="efa"), [], r"^FAIL  provider: FI_PROVIDER=efa .* leaves tcp out")
        expect_check_fails("wrong token", dict(worker, TALLY_TOKEN="not-the-token"), [], r"^FAIL  all-reduce: .*wrong or missing token")
        down = f"{servers},127.0.0.1:{free_port()}"
        expect_check_fails("a server down", worker, ["--servers", down], r"^FAIL  servers: not answering: 127\.0\.0\.1:\d+ \(Connection refused\)")
    finally:
        for p in procs:
            p.send_signal(signal.SIGINT)  # drains: no jobs left, so it exits
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    print("test-wheel: installed wheel ok")


if __name__ == "__main__":
    main()
