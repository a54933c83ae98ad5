#!/usr/bin/env bash
# Fetch what testbed/device-check.sh installs on a GPU machine that has no network: fleet and its
# dependencies as Python 3.12 wheels in .whl/, Debian bookworm's OpenSSH and psmisc (with the libraries
# they link) in .deb/; with BEFORE_REV=<rev>, fleet as committed there in .whl-before/ (for
# testbed/device-sweep-ab.sh). The folders are git-ignored locally (.git/info/exclude) and carried there.
set -euo pipefail
cd "$(dirname "$0")/.."
for d in .whl .deb .whl-before; do grep -qx "/$d/" .git/info/exclude || echo "/$d/" >>.git/info/exclude; done
rm -rf .whl .deb .whl-before && mkdir .whl .deb
python3 -m pip wheel -q --no-deps . -w .whl
if [ -n "${BEFORE_REV:-}" ]; then
    before=$(mktemp -d)
    git worktree add -q --detach "$before" "$BEFORE_REV"
    python3 -m pip wheel -q --no-deps "$before" -w .whl-before
    git worktree remove --force "$before"
fi
platforms=()
for p in manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1; do
    platforms+=(--platform "${p}_x86_64")
done
for d in .whl .whl-before; do  # each fleet with its own dependencies (they may differ between the builds)
    [ -d "$d" ] || continue
    python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
        -d "$d" "$d"/fleet-*.whl
done
(cd .deb && apt-get download -q openssh-server openssh-client openssh-sftp-server psmisc libwrap0 libnsl2 \
    libtirpc3 libtirpc-common libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libkeyutils1 libcom-err2 \
    libaudit1 libcap-ng0 libpam0g libsystemd0 libgcrypt20 libgpg-error0 libcap2 libselinux1 libpcre2-8-0 \
    libcrypt1 libfido2-1 libcbor0.8 libedit2 libbsd0 libmd0 2>/dev/null)
du -sh .whl .deb
