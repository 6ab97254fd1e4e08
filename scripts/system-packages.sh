#!/bin/sh
# The system's packages `make` needs beside the venv, installed where it can: as root, with
# apt-get, and only those missing. nftables: `network: outbound` (the default) writes its packet
# rules with nft, and a root host refuses to start without it. iproute2: the egress tests make
# their own network namespace with `ip`. Anywhere else (not root, no apt-get) nothing happens:
# a host without nft then says so when it starts.
set -eu

missing=""
command -v nft >/dev/null 2>&1 || [ -x /usr/sbin/nft ] || missing="$missing nftables"
command -v ip >/dev/null 2>&1 || [ -x /usr/sbin/ip ] || [ -x /sbin/ip ] || missing="$missing iproute2"
[ -n "$missing" ] || exit 0
[ "$(id -u)" = 0 ] || exit 0
command -v apt-get >/dev/null 2>&1 || exit 0

echo "installing$missing (apt-get)"
export DEBIAN_FRONTEND=noninteractive
# shellcheck disable=SC2086 # one word per package
apt-get install -y -q --no-install-recommends $missing >/dev/null 2>&1 || {
	apt-get update -q >/dev/null
	apt-get install -y -q --no-install-recommends $missing >/dev/null
}
