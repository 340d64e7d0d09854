"""A real OpenSSH server for tests: sshd on 127.0.0.1, a free port, fresh host and user keys,
a private known_hosts and ssh_config. No root-only paths are needed (except /run/sshd, which
sshd insists on when it runs as root; we create it then)."""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil


def find_sshd() -> str | None:
    for cand in (shutil.which("sshd"), "/usr/sbin/sshd", "/usr/local/sbin/sshd"):
        if cand and os.path.exists(cand):
            return cand
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keygen(path: Path, comment: str) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True)
    pub = path.with_suffix(".pub") if path.suffix else Path(str(path) + ".pub")
    return pub.read_text().strip()


@dataclass
class SSHD:
    """A running sshd and the client-side files that trust it."""

    dir: Path
    port: int
    user: str
    host_key: Path
    user_key: Path
    known_hosts: Path
    ssh_config: Path
    alias: str
    proc: subprocess.Popen | None = None

    @property
    def target(self) -> str:
        """user@127.0.0.1:port, the form the console config accepts."""
        return f"{self.user}@127.0.0.1:{self.port}"

    def ssh_argv(self) -> list[str]:
        """An OpenSSH client command line reaching this server (for rsync/tail comparisons)."""
        return ["ssh", "-F", str(self.ssh_config), self.alias]

    def children(self) -> list[psutil.Process]:
        """The per-connection sshd processes (kill one to drop that connection)."""
        assert self.proc is not None
        try:
            return psutil.Process(self.proc.pid).children(recursive=False)
        except psutil.NoSuchProcess:
            return []

    def drop_connections(self) -> int:
        """Kill every connection's sshd child, as a network drop or server restart would."""
        kids = self.children()
        for k in kids:
            try:
                k.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(kids, timeout=5)
        return len(kids)

    def restart(self) -> None:
        """Start again after stop(): the same port, keys and config (a host coming back)."""
        sshd = find_sshd()
        assert sshd is not None and (self.proc is None or self.proc.poll() is not None)
        self.proc = serve(sshd, self.dir, self.port)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.drop_connections()
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def start_sshd(dir: Path, sftp: bool = True) -> SSHD:
    """sftp=False leaves out the `Subsystem sftp` line, as some hardened sshd_configs do."""
    sshd = find_sshd()
    if sshd is None:
        raise RuntimeError("no sshd binary")
    dir.mkdir(parents=True, exist_ok=True)
    os.chmod(dir, 0o700)
    user = getpass.getuser()
    host_key = dir / "host_ed25519"
    host_pub = keygen(host_key, "test-host")
    user_key = dir / "id_ed25519"
    user_pub = keygen(user_key, "test-user")
    (dir / "authorized_keys").write_text(user_pub + "\n")
    os.chmod(dir / "authorized_keys", 0o600)
    port = free_port()
    known_hosts = dir / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{port} {' '.join(host_pub.split()[:2])}\n")
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", exist_ok=True)
    cfg = dir / "sshd_config"
    cfg.write_text("\n".join([
        f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {host_key}",
        f"AuthorizedKeysFile {dir / 'authorized_keys'}", f"PidFile {dir / 'sshd.pid'}",
        "StrictModes no", "UsePAM no", "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PubkeyAuthentication yes", "PermitRootLogin yes",
        *(["Subsystem sftp internal-sftp"] if sftp else []),
        "ClientAliveInterval 0", "MaxSessions 64", "MaxStartups 64:30:128", "LogLevel ERROR",
        # keep the environment of commands predictable
        "PermitUserEnvironment no", "AcceptEnv LANG LC_*", "",
    ]))
    alias = "eagle3-test"
    ssh_config = dir / "ssh_config"
    ssh_config.write_text("\n".join([
        f"Host {alias}", "  HostName 127.0.0.1", f"  Port {port}", f"  User {user}",
        f"  IdentityFile {user_key}", "  IdentitiesOnly yes", f"  UserKnownHostsFile {known_hosts}",
        "  StrictHostKeyChecking yes", "  BatchMode yes", "  LogLevel ERROR", "",
    ]))
    proc = serve(sshd, dir, port)
    return SSHD(dir=dir, port=port, user=user, host_key=host_key, user_key=user_key,
                known_hosts=known_hosts, ssh_config=ssh_config, alias=alias, proc=proc)


def serve(sshd: str, dir: Path, port: int) -> subprocess.Popen:
    """Start sshd on dir's sshd_config and wait until it answers on port."""
    log = open(dir / "sshd.log", "ab")  # noqa: SIM115
    proc = subprocess.Popen([sshd, "-D", "-e", "-f", str(dir / "sshd_config")], stdout=log,
                            stderr=log)
    deadline = time.time() + 15
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited {proc.returncode}: {(dir / 'sshd.log').read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                if s.recv(4).startswith(b"SSH-"):
                    break
        except OSError:
            time.sleep(0.05)
    else:
        proc.kill()
        raise RuntimeError("sshd did not start listening within 15 s")
    return proc
