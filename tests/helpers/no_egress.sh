#!/bin/sh
# Run "$@" in a fresh network namespace whose only way out is a veth link, and print
# "tx_packets=N": the packets the command sent to any non-loopback address (N = 0: none).
# With tcpdump installed, also print each packet that left (what, to where), for the diagnosis.
set -e
ip link set lo up
# The kernel's own IPv6 chatter on a new link (router solicitations, which it repeats for as long
# as the link is up, listener reports, duplicate-address probes) is not the command's: switched
# off for every link created from here on, before the veth link exists.
for setting in accept_ra=0 router_solicitations=0 dad_transmits=0 accept_dad=0 \
    mldv1_unsolicited_report_interval=0 mldv2_unsolicited_report_interval=0; do
  sysctl -qw "net.ipv6.conf.default.$setting" "net.ipv6.conf.all.$setting" 2>/dev/null || true
done
ip link add lp-out type veth peer name lp-peer
ip addr add 10.213.0.1/24 dev lp-out
ip -6 addr add fd00:213::1/64 dev lp-out nodad
ip link set lp-peer up
ip link set lp-out up
ip route add default dev lp-out
ip -6 route add default dev lp-out
sleep 1
capture=""
if command -v tcpdump >/dev/null 2>&1; then
  capture=$(mktemp)
  tcpdump -i lp-out -n -U -w "$capture" 2>/dev/null &
  dump=$!
  sleep 1
fi
before=$(awk '/lp-out:/ {print $11}' /proc/net/dev)
status=0
"$@" || status=$?
after=$(awk '/lp-out:/ {print $11}' /proc/net/dev)
echo "tx_packets=$((after - before))"
if [ -n "$capture" ]; then
  sleep 1
  kill "$dump" 2>/dev/null || true
  wait "$dump" 2>/dev/null || true
  if [ "$after" != "$before" ]; then
    echo "what left the namespace (tcpdump; with no answer on the link, a connection shows as ARP \"who-has\" its address):"
    tcpdump -n -r "$capture" 2>/dev/null | head -40
  fi
  rm -f "$capture"
fi
exit $status
