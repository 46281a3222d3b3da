"""Certificates for TLS tests and benches, made with ``cryptography``: a CA and server
certificates it signs for ``localhost`` and ``127.0.0.1`` (the way cert-manager's CA issuer
would). ``tests/support/tls_certs.py`` re-exports them."""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass
class Authority:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate
    path: Path
    """The CA certificate as PEM: what a client (the API server's caBundle) trusts."""


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


_CA_USAGE = x509.KeyUsage(
    digital_signature=True,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    key_cert_sign=True,
    crl_sign=True,
    encipher_only=False,
    decipher_only=False,
)


def make_ca(directory: Path) -> Authority:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("gatekeeper test CA"))
        .issuer_name(_name("gatekeeper test CA"))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_CA_USAGE, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    path = directory / "ca.crt"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return Authority(key, cert, path)


def issue(ca: Authority, cert_path: Path, key_path: Path, *, client: bool = False) -> int:
    """A server certificate for localhost/127.0.0.1 (with ``client``, a client
    certificate of ``kube-apiserver``, as the apiserver presents to a webhook), written
    atomically (as a Secret volume swaps its files); returns its serial number."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    serial = x509.random_serial_number()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("kube-apiserver" if client else "localhost"))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(serial)
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=2))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False
        )
        .sign(ca.key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    for path, data in (
        (key_path, key_pem),
        (cert_path, cert.public_bytes(serialization.Encoding.PEM)),
    ):
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    return serial
