"""Host code every fleet host script shares for reading the machine: the process table, listening sockets
and client connections, and who holds the GPU device files -- from /proc and the kernel's sock_diag.

Prepended after fleet.host.common when a step is sent (fleet.hostscripts), so it runs under the host's
own Python: standard library only, Python 3.8. Imported as a module by fleet's tests.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import stat
import subprocess
from typing import Any, Callable, Dict, Iterable, List, Optional, Set, Tuple

try:  # the shared host code is prepended when this script is sent to a host
    argv_of  # noqa: B018
except NameError:  # imported as a module (fleet's own tests)
    from fleet.host.common import argv_of
    from fleet.protocol import ProcessInfo

LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp
CMDLINE_LIMIT = 2000  # characters of a command line kept in what a step reports


def read_text(path: str, limit: int = 1 << 20) -> Optional[str]:
    """A regular file's text (at most `limit` bytes), or None. Never waits: a FIFO planted under a file's
    name (a model's config.json) would hang the step, and whoever holds its lock after it."""
    try:
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None
            return f.read(limit).decode("utf-8", "replace")
    except OSError:
        return None


def pids() -> List[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def argv_at(pid: int) -> Optional[List[str]]:
    """The process's argv, or None when it is gone or cannot be read."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return argv_of(f.read())
    except OSError:
        return None


def _stat_fields(pid: int) -> Optional[Tuple[str, List[str]]]:
    """(comm, the fields after it) of /proc/PID/stat: comm may hold spaces and parentheses."""
    stat = read_text("/proc/%d/stat" % pid)
    if not stat or ")" not in stat:
        return None
    return stat[stat.find("(") + 1 : stat.rfind(")")], stat.rsplit(")", 1)[1].split()


def parent_of(pid: int) -> Optional[int]:
    """The parent of a process (its ppid), or None when it is gone."""
    stat = _stat_fields(pid)
    return int(stat[1][1]) if stat else None


def live_lookup(pid: int) -> Optional[Tuple[int, List[str]]]:
    """A process's (ppid, argv) as /proc shows it now, or None when it is gone: engine_under's lookup."""
    argv, ppid = argv_at(pid), parent_of(pid)
    return (ppid, argv) if argv is not None and ppid is not None else None


def table_lookup(procs: Dict[int, ProcessInfo]) -> Callable[[int], Optional[Tuple[int, List[str]]]]:
    """engine_under's lookup in a process table read before."""
    return lambda pid: (procs[pid]["ppid"], procs[pid]["argv"]) if pid in procs else None


def uid_of(pid: int) -> Optional[int]:
    """The user a process runs as: the real uid of its status. Not the owner of /proc/PID, which is root
    for a process that made itself non-dumpable, whoever runs it."""
    found = re.search(r"^Uid:\s+(\d+)", read_text("/proc/%d/status" % pid) or "", re.M)
    return int(found.group(1)) if found else None


def process(pid: int, argv: Optional[List[str]] = None) -> Optional[ProcessInfo]:
    """What a step needs to know of one process, or None when it is gone: identity (pid, pgid, its start
    in clock ticks), owner (uid, user) and what it runs (argv, cmdline)."""
    argv = argv if argv is not None else argv_at(pid)
    stat = _stat_fields(pid)
    if argv is None or stat is None or len(stat[1]) < 20:
        return None
    comm, rest = stat
    uid = uid_of(pid)
    try:
        user = pwd.getpwuid(uid).pw_name if uid is not None else "?"
    except KeyError:
        user = str(uid)
    info: ProcessInfo = {
        "pid": pid,
        "ppid": int(rest[1]),
        "pgid": int(rest[2]),
        "uid": uid,
        "user": user,
        "comm": comm,
        "state": rest[0],
        "start_ticks": int(rest[19]),
        "cmdline": " ".join(argv)[:CMDLINE_LIMIT],
        "argv": argv,
    }
    return info


def process_table() -> Dict[int, ProcessInfo]:
    out = {}
    for pid in pids():
        p = process(pid)
        if p:
            out[pid] = p
    return out


def alive(pid: int) -> bool:
    """Running: a zombie has exited (only its parent has not collected it yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = _stat_fields(pid)
    return stat is not None and bool(stat[1]) and stat[1][0] != "Z"


def live_process_groups() -> Set[int]:
    """Process group ids that have a member still running."""
    out: Set[int] = set()
    for pid in pids():
        stat = _stat_fields(pid)
        if stat and len(stat[1]) > 2 and stat[1][0] != "Z":
            out.add(int(stat[1][2]))
    return out


def boot_id() -> Optional[str]:
    text = read_text("/proc/sys/kernel/random/boot_id")
    return text.strip() if text else None


def start_ticks(pid: int) -> Optional[int]:
    """When `pid` started, in clock ticks since boot (/proc/PID/stat field 22), or None when it is gone."""
    stat = _stat_fields(pid)
    try:
        return int(stat[1][19]) if stat else None
    except (ValueError, IndexError):
        return None


def started_as(pid: int) -> List[Any]:
    """What tells process `pid` from a later one given the same pid: this boot, and its start time."""
    return [boot_id(), start_ticks(pid)]


def still_runs(pid: Any, started: Any) -> bool:
    """Whether process `pid` runs and is the one `started` (its started_as, when it was recorded) names; a
    record without it (an older fleet's) has its pid alone to go by."""
    if not isinstance(pid, int) or pid <= 0 or not alive(pid):
        return False
    if not (isinstance(started, list) and len(started) == 2 and isinstance(started[1], int)):
        return True
    return bool(started[0] == boot_id() and start_ticks(pid) == started[1])


# --- sockets ---------------------------------------------------------------------------------------------


def ip_literal(address: str) -> Optional[str]:
    """An IP address as the listener tables write it (one spelling of each IPv6 address), else None."""
    import _socket as socket  # the C module, as in _listening_netlink

    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            return socket.inet_ntop(family, socket.inet_pton(family, address))
        except (OSError, ValueError):
            continue
    return None


def listening_sockets() -> Dict[str, Tuple[str, int]]:
    """inode -> (address, port) for every listening TCP socket (an IPv6 address as inet_ntop writes it:
    "::" is its wildcard)."""
    try:
        return _listening_netlink()
    except Exception:  # no AF_NETLINK (a locked-down container): the /proc tables say the same
        return _listening_proc()


def _listening_netlink() -> Dict[str, Tuple[str, int]]:
    """Asked of the kernel's sock_diag for listening sockets only: /proc/net/tcp walks the whole
    established-connection table to list them (3-7 ms on a host with a large one; this ~0.05 ms)."""
    import _socket as socket  # the C module: socket.py's enum set-up would cost more (~3 ms) than the query
    import struct

    found = {}
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 4)  # NETLINK_SOCK_DIAG
    sock.settimeout(5)
    try:
        for family in (socket.AF_INET, socket.AF_INET6):
            # inet_diag_req_v2: family, protocol, ext, pad, state mask (1 << TCP_LISTEN), a zeroed sockid
            request = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 1 << 10) + bytes(48)
            # nlmsghdr: length, SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, sequence, port id
            sock.send(struct.pack("=IHHII", 16 + len(request), 20, 0x301, 1, 0) + request)
            done = False
            while not done:
                data = sock.recv(1 << 16)
                if not data:
                    raise OSError("netlink: no answer")
                offset = 0
                while offset + 16 <= len(data):
                    length, kind = struct.unpack_from("=IH", data, offset)
                    if kind == 3:  # NLMSG_DONE
                        done = True
                        break
                    if kind == 2 or length < 16:  # NLMSG_ERROR
                        raise OSError("netlink: error answer")
                    body = offset + 16  # inet_diag_msg
                    port = struct.unpack_from(">H", data, body + 4)[0]
                    source = data[body + 8 : body + 24]
                    inode = struct.unpack_from("=I", data, body + 68)[0]
                    if data[body] == socket.AF_INET:
                        address = socket.inet_ntop(socket.AF_INET, source[:4])
                    else:
                        address = socket.inet_ntop(socket.AF_INET6, bytes(source))
                    found[str(inode)] = (address, port)
                    offset += (length + 3) & ~3
    finally:
        sock.close()
    return found


def _tcp_table() -> List[Tuple[str, str, int, str, bool]]:
    """(state, local address hex, local port, inode, is IPv6) of every TCP socket in /proc/net/tcp{,6}."""
    rows = []
    for path, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        for line in (read_text(path, 1 << 30) or "").splitlines()[1:]:
            parts = line.split()
            if len(parts) > 9:
                addr, port = parts[1].split(":")
                rows.append((parts[3], addr, int(port, 16), parts[9], v6))
    return rows


def _listening_proc() -> Dict[str, Tuple[str, int]]:
    import _socket as socket  # the C module, as in _listening_netlink

    found = {}
    for state, addr, port, inode, v6 in _tcp_table():
        if state != LISTEN:
            continue
        if v6:  # four 32-bit words, each in the host's byte order
            raw = b"".join(bytes.fromhex(addr[i : i + 8])[::-1] for i in range(0, 32, 8))
            found[inode] = (socket.inet_ntop(socket.AF_INET6, raw), port)
        else:
            found[inode] = (".".join(str(b) for b in bytes.fromhex(addr)[::-1]), port)
    return found


def socket_inodes(pid: int) -> Set[str]:
    """Inodes of the sockets `pid` holds open (empty when its fds cannot be read)."""
    out: Set[str] = set()
    try:
        fds = os.listdir("/proc/%d/fd" % pid)
    except OSError:
        return out
    for fd in fds:
        try:
            target = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(target[8:-1])
    return out


def socket_owners(inodes: Set[str]) -> Dict[str, int]:
    """inode -> the first pid seen holding it, for the sockets asked about (another user's are unseen)."""
    owners: Dict[str, int] = {}
    for pid in pids():
        for inode in socket_inodes(pid) & inodes:
            owners.setdefault(inode, pid)
    return owners


def port_holders(port: int, bind_address: str = "0.0.0.0") -> Tuple[Set[int], bool]:
    """(pids listening where a server binding bind_address:port would collide, whether some such listener
    has no owner fleet can see: another user's process). Every holder counts: fleet's old server on one
    address and someone else's on another both stand in the way."""
    specific = ip_literal(bind_address)  # a host name is weighed as every address: it may be any
    specific = None if specific in ("0.0.0.0", "::") else specific
    inodes = set(
        inode
        for inode, (address, p) in listening_sockets().items()
        if p == port and (specific is None or address in ("0.0.0.0", "::", specific))
    )
    owners = socket_owners(inodes) if inodes else {}
    return set(owners.values()), any(inode not in owners for inode in inodes)


def client_connections(pids_: List[int]) -> Optional[int]:
    """Connections clients hold open to the ports these processes listen on; None if they listen on none.
    A request in flight holds its connection, so 0 means nothing to drain."""
    rows = _tcp_table()
    listening = dict((inode, port) for state, _, port, inode, _ in rows if state == LISTEN)
    ports = set(listening[i] for pid in pids_ for i in socket_inodes(pid) if i in listening)
    if not ports:
        return None
    # ESTABLISHED, SYN_RECV, CLOSE_WAIT: a client is there or its request may still be running
    return sum(1 for state, _, port, _, _ in rows if state in ("01", "03", "08") and port in ports)


# --- GPU device files ------------------------------------------------------------------------------------


def device_holders(files: List[str]) -> Tuple[Set[int], str]:
    """(pids holding any of these device files, how it was found: "fuser", "proc" or "none")."""
    if not files:
        return set(), "none"
    if shutil.which("fuser"):
        try:
            out = subprocess.run(["fuser"] + files, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout
            return set(int(t) for t in re.findall(rb"\d+", out)), "fuser"
        except OSError:
            pass
    real = set(os.path.realpath(f) for f in files)
    found: Set[int] = set()
    for pid in pids():
        try:
            fds = os.listdir("/proc/%d/fd" % pid)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.path.realpath("/proc/%d/fd/%s" % (pid, fd)) in real:
                    found.add(pid)
                    break
            except OSError:
                continue
    return found, "proc"


def holders_by_file(files: List[str], among: Optional[Set[int]] = None) -> Dict[str, List[int]]:
    """Pids holding each of these device files (which GPU a process holds, not only that it holds one).
    `among`: the pids that hold any of them, found already. Their descriptors and mappings are read first,
    matched by device and inode as `fuser` matches them (a bind mount or another mount namespace names
    the same file by another path); only where one of them is left unplaced (a process fleet may not
    read) does `fuser` scan every process of the host once per file."""
    if among is not None:
        placed = _by_inode(files, sorted(among))
        if set(pid for held in placed.values() for pid in held) >= among:
            return placed
    if shutil.which("fuser"):
        out: Dict[str, List[int]] = {}
        try:
            for f in files:
                found = subprocess.run(["fuser", f], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout
                out[f] = sorted(int(t) for t in re.findall(rb"\d+", found))
            return out
        except OSError:
            pass
    return _by_inode(files, pids())


def _by_inode(files: List[str], candidates: Iterable[int]) -> Dict[str, List[int]]:
    """Which of `candidates` hold each file: an open descriptor or a mapping of the same inode."""
    by_key: Dict[Tuple[int, int], str] = {}
    for f in files:
        try:
            st = os.stat(f)
        except OSError:
            continue
        by_key[(st.st_dev, st.st_ino)] = f
    scanned: Dict[str, List[int]] = dict((f, []) for f in files)
    for pid in candidates:
        held = set()
        try:
            fds = os.listdir("/proc/%d/fd" % pid)
        except OSError:
            fds = []
        for fd in fds:
            try:
                st = os.stat("/proc/%d/fd/%s" % (pid, fd))
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in by_key:
                held.add(by_key[(st.st_dev, st.st_ino)])
        for line in (read_text("/proc/%d/maps" % pid) or "").splitlines():  # mapped, descriptor closed
            fields = line.split()
            if len(fields) >= 5 and ":" in fields[3] and fields[4].isdigit() and fields[4] != "0":
                major, minor = (int(x, 16) for x in fields[3].split(":", 1))
                mapped = by_key.get((os.makedev(major, minor), int(fields[4])))
                if mapped is not None:
                    held.add(mapped)
        for f in held:
            scanned[f].append(pid)
    return scanned
