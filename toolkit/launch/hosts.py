"""The hosts of a job: -H and hostfiles parsed, every host resolved and its ssh port probed before a
launcher starts (one line naming the first host that fails), which of them are this machine. `spec`
below is the launch's LaunchSpec (toolkit/launch/spec.py): its hosts, ssh options and timeout."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
from concurrent.futures import ThreadPoolExecutor

from toolkit.errors import ToolkitError


def parse_hosts(hosts: str) -> list[tuple[str, int]]:
    """"a:4,b:4" -> [("a", 4), ("b", 4)]; a host without slots has 1 (horovodrun's rule)."""
    out = []
    for item in hosts.split(","):
        item = item.strip()
        name, _, slots = item.partition(":")
        if not name:
            raise ToolkitError(f"-H {hosts!r}: empty host name; write host:slots[,host:slots]")
        try:
            count = int(slots) if slots else 1
        except ValueError:
            raise ToolkitError(f"-H {hosts!r}: slots of {name!r} must be an integer, e.g. {name}:4") from None
        if count < 1:
            raise ToolkitError(f"-H {hosts!r}: {name} has {count} slots; give at least 1")
        out.append((name, count))
    return out


def total_slots(hosts: str) -> int:
    return sum(slots for _, slots in parse_hosts(hosts))


def read_hostfile(path: str) -> str:
    """A hostfile (`host slots=N` as mpirun and horovodrun write it, or `host:N`, or `host`; `#`
    comments) as the -H string "host:N,...", so every launcher and recipe reads one format."""
    if not os.path.isfile(path):
        raise ToolkitError(f"--hostfile {path}: file not found; check the path")
    hosts = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            name, slots = words[0], "1"
            if ":" in name:
                name, slots = name.split(":", 1)
            for word in words[1:]:
                key, _, value = word.partition("=")
                if key not in ("slots", "max_slots", "max-slots") or not value:
                    raise ToolkitError(f"--hostfile {path}, line {number}: {word!r} not understood; write "
                                       f"`{name} slots=N` or `{name}:N`")
                if key == "slots":
                    slots = value
            hosts.append(f"{name}:{slots}")
    if not hosts:
        raise ToolkitError(f"--hostfile {path}: no hosts in it; write one `host slots=N` a line")
    text = ",".join(hosts)
    parse_hosts(text)       # the same checks as -H
    return text


def check_hosts(spec) -> None:
    """Before any launcher starts: every host of -H/--hostfile has an address, and every other host's
    ssh port takes a connection within --start-timeout (all hosts at once). One line naming the first
    host that fails; without this, mpirun prints a 20-line banner, horovodrun's ssh check takes up to
    five 10-second tries (and is skipped for an hour once it passed), and a host that drops packets
    holds ssh for TCP's two minutes. Whether ssh then logs in is left to the launcher."""
    hosts = [host for host, _ in parse_hosts(spec.hosts or "localhost:1")]
    for host in hosts:
        try:
            socket.getaddrinfo(host, None)
        except (socket.gaierror, UnicodeError) as e:
            reason = getattr(e, "strerror", None) or str(e)
            raise ToolkitError(f"launch: cannot reach {host}: the name does not resolve ({reason}); check the host "
                               f"names in -H/--hostfile", code=1) from None
    remote = [host for host in dict.fromkeys(hosts) if not is_this_machine(host)]
    if not remote:
        return
    if shutil.which("ssh") is None:
        raise ToolkitError(f"launch: ssh not found on PATH; the ranks on {remote[0]} are started over ssh "
                           "(apt-get install openssh-client)", code=1)
    with ThreadPoolExecutor(max_workers=min(32, len(remote))) as pool:
        failures = [why for why in pool.map(lambda host: ssh_port_answers(host, spec), remote) if why]
    if failures:
        raise ToolkitError(f"launch: cannot reach {failures[0]}", code=1)


def is_this_machine(host: str) -> bool:
    """A name of this machine: by name, or because one of its addresses is on this machine (binding
    to it works), as horovodrun and mpirun treat it: started without ssh."""
    if is_local(host):
        return True
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return False
    for family, _, _, _, address in infos:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.bind((address[0], 0))
            return True
        except OSError:
            continue
    return False


def ssh_port_answers(host: str, spec) -> str | None:
    """None when `host`'s ssh port (as ssh's own configuration resolves it: `ssh -G`) takes a TCP
    connection within --start-timeout; else what went wrong, starting with the host's name. Hosts
    reached through a ProxyJump or ProxyCommand are left to ssh."""
    try:
        shown = subprocess.run(["ssh", "-G", *spec.ssh_options(), host], capture_output=True, text=True,
                               timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        shown = ""
    config = dict(line.split(" ", 1) for line in shown.splitlines() if " " in line)
    if config.get("proxyjump", "none") != "none" or config.get("proxycommand", "none") != "none":
        return None
    name, port = config.get("hostname", host), int(config.get("port") or spec.ssh_port or 22)
    name = host if name.lower() == host.lower() else name      # ssh -G writes names in lower case
    try:
        with socket.create_connection((name, port), timeout=spec.start_timeout):
            return None
    except socket.timeout:
        return (f"{host}: nothing answered on its ssh port ({name}:{port}) within --start-timeout "
                f"{spec.start_timeout} s; is it up, and is that its name in -H/--hostfile?")
    except ConnectionRefusedError:
        return (f"{host}: its ssh port ({name}:{port}) refused the connection; start sshd there, or give its "
                "port with --ssh-port")
    except OSError as e:
        return f"{host}: its ssh port ({name}:{port}): {e.strerror or e}; is it up, and is that its name in -H/--hostfile?"


def is_local(host: str) -> bool:
    return host in ("localhost", "127.0.0.1", socket.gethostname())


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` ("": on every interface, for ranks on other nodes)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
