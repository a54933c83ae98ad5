#!/bin/sh
# Debian packages the tests, the demo and the benchmark need: a real OpenSSH sshd and client, fuser
# (psmisc), ps/pgrep (procps), unshare (util-linux), crontab (cron). Installs only what is missing.
set -eu
missing=""
command -v ssh >/dev/null 2>&1 || missing="$missing openssh-client"
[ -x /usr/sbin/sshd ] || missing="$missing openssh-server"
command -v fuser >/dev/null 2>&1 || missing="$missing psmisc"
command -v pgrep >/dev/null 2>&1 || missing="$missing procps"
command -v crontab >/dev/null 2>&1 || missing="$missing cron"
command -v unshare >/dev/null 2>&1 || missing="$missing util-linux"
[ -z "$missing" ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "missing system packages:$missing — install them (Debian: sudo apt-get install$missing)" >&2
  exit 1
fi
echo "installing:$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends $missing >/dev/null
