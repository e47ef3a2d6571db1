#!/bin/sh
# Run "$@" in a fresh network namespace whose only way out is a veth link, and print
# "tx_packets=N": the packets the command sent to any non-loopback address (N = 0: none).
set -e
ip link set lo up
ip link add lp-out type veth peer name lp-peer
sysctl -qw net.ipv6.conf.lp-out.accept_ra=0 net.ipv6.conf.lp-out.router_solicitations=0 \
    net.ipv6.conf.lp-out.dad_transmits=0 net.ipv6.conf.lp-out.mldv1_unsolicited_report_interval=0 \
    net.ipv6.conf.lp-out.mldv2_unsolicited_report_interval=0 2>/dev/null || true
ip addr add 10.213.0.1/24 dev lp-out
ip -6 addr add fd00:213::1/64 dev lp-out nodad
ip link set lp-peer up
ip link set lp-out up
ip route add default dev lp-out
ip -6 route add default dev lp-out
sleep 1
before=$(awk '/lp-out:/ {print $11}' /proc/net/dev)
status=0
"$@" || status=$?
after=$(awk '/lp-out:/ {print $11}' /proc/net/dev)
echo "tx_packets=$((after - before))"
exit $status
