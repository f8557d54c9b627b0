"""A throwaway certificate authority and a certificate for localhost, for the local GitHub API server.

Made with the `openssl` command line (no Python dependency): a CA valid for two days and a server
certificate it signs for `localhost` and `127.0.0.1`. Clients trust it through the CA file
(`SSL_CERT_FILE` for gh, `GIT_SSL_CAINFO` for git).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

_EXTENSIONS = (
    "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
    "basicConstraints=CA:FALSE\n"
    "keyUsage=digitalSignature,keyEncipherment\n"
    "extendedKeyUsage=serverAuth\n"
)


@dataclass(frozen=True)
class Certificates:
    ca_file: Path  # the CA certificate clients trust
    cert_file: Path  # the server's certificate
    key_file: Path  # the server's private key


def _openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {done.stderr.strip()[-300:]}")


def make_certificates(directory: Path) -> Certificates:
    """A new CA and a localhost certificate in directory (created); RuntimeError when openssl fails."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "server.ext").write_text(_EXTENSIONS)
    key = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl(
        "req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=stellafleet test CA",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=directory,
    )  # fmt: skip
    _openssl(
        "req", "-new", *key, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost",
        cwd=directory,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "server.pem", "-days", "2", "-extfile", "server.ext",
        cwd=directory,
    )  # fmt: skip
    return Certificates(directory / "ca.pem", directory / "server.pem", directory / "server.key")
