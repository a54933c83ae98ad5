#!/bin/sh
# Debian packages the tests, the demo and the benchmark need: a real OpenSSH sshd and client, fuser
# (psmisc), ps/pgrep (procps), unshare (util-linux), crontab (cron), and for engines in containers podman
# with runc and debootstrap (the test images are made here), Debian's docker.io (dockerd, tested too), and
# rsync (the benchmark's floor for `fleet pull --from`), and docker-registry (a real registry on loopback
# for `fleet engine pull`).
# Installs only what is missing.
set -eu
configure_podman() {
  # crun fails on these machines ("cgroups in hybrid mode not supported"), and runc needs explicit limits
  # ("setrlimit RLIMIT_NOFILE: Operation not permitted"): ../shared/reference/scale-out.md section 1
  [ "$(id -u)" = 0 ] || return 0
  [ -e /etc/containers/containers.conf ] && return 0
  mkdir -p /etc/containers
  printf '# written by fleet testbed/install-system-deps.sh\n[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]\n[engine]\nruntime = "runc"\n' \
    > /etc/containers/containers.conf
}
missing=""
command -v ssh >/dev/null 2>&1 || missing="$missing openssh-client"
[ -x /usr/sbin/sshd ] || missing="$missing openssh-server"
command -v fuser >/dev/null 2>&1 || missing="$missing psmisc"
command -v pgrep >/dev/null 2>&1 || missing="$missing procps"
command -v crontab >/dev/null 2>&1 || missing="$missing cron"
command -v unshare >/dev/null 2>&1 || missing="$missing util-linux"
command -v ip >/dev/null 2>&1 || missing="$missing iproute2"        # hosts with networks of their own
command -v iptables >/dev/null 2>&1 || missing="$missing iptables"  # and a firewall between them
command -v podman >/dev/null 2>&1 || missing="$missing podman"
command -v runc >/dev/null 2>&1 || missing="$missing runc"
command -v debootstrap >/dev/null 2>&1 || missing="$missing debootstrap"
command -v dockerd >/dev/null 2>&1 || missing="$missing docker.io"
command -v rsync >/dev/null 2>&1 || missing="$missing rsync"          # the benchmark's floor for a push
command -v docker-registry >/dev/null 2>&1 || missing="$missing docker-registry"  # a registry to pull from
if [ -z "$missing" ]; then configure_podman; exit 0; fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "missing system packages:$missing — install them (Debian: sudo apt-get install$missing)" >&2
  exit 1
fi
echo "installing:$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends $missing >/dev/null
configure_podman
