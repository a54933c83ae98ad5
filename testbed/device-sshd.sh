# Sourced by the device scripts (as root, no network): OpenSSH and fuser for the simulated hosts, from
# the Debian packages in .deb/ when the machine lacks them. Needs REPO and WORK.
if ! command -v sshd >/dev/null && [ ! -x /usr/sbin/sshd ] || ! command -v ssh >/dev/null || ! command -v fuser >/dev/null; then
    # Debian bookworm's OpenSSH and psmisc, unpacked beside the system; any library the system lacks
    # is linked in from the packages too (only those: the system's own copies stay first).
    DEBROOT=$WORK/debroot LIBS=$WORK/libs
    mkdir -p "$DEBROOT" "$LIBS"
    for deb in "$REPO"/.deb/*.deb; do dpkg-deb -x "$deb" "$DEBROOT"; done
    for _ in 1 2 3; do  # a library found this round can need one of its own that the system lacks
        for bin in "$DEBROOT/usr/sbin/sshd" "$DEBROOT/usr/bin/ssh" "$DEBROOT/usr/bin/ssh-keygen"; do
            for lib in $(LD_LIBRARY_PATH=$LIBS ldd "$bin" | awk '/not found/ {print $1}'); do
                ln -sf "$(find "$DEBROOT" -name "$lib" | head -1)" "$LIBS/$lib"
            done
        done
    done
    export LD_LIBRARY_PATH=$LIBS PATH=$PATH:$DEBROOT/usr/sbin:$DEBROOT/usr/bin
    command -v fuser >/dev/null || cp "$DEBROOT/bin/fuser" /usr/local/bin/fuser  # the hosts' sessions need it
    ls "$LIBS"
fi
getent passwd sshd >/dev/null || useradd --system --no-create-home --home-dir /run/sshd --shell /usr/sbin/nologin sshd
