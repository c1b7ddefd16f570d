# shellcheck shell=bash
# tcp-ceiling (linerate.sh's p2p part): the transport ceiling, tally bench p2p
# --provider tcp --hubs 2 --leaves 4 (16M), beside the kernel's own figure:
# the same streams as plain TCP sockets (probes.py tcp-ceiling). Summary only.
say ""
say "## transport ceiling, tcp on loopback: 2 hubs x 4 leaves, 16 MiB, beside plain TCP sockets"
"$TALLY" bench p2p --provider tcp --hubs 2 --leaves 4 --sizes 16M 2>&1 | grep -v '^$' | tail -6 | tee -a "$S"
probe tcp-ceiling | tee -a "$S"
