"""A test CA and the certificates it issues, for receivers that speak TLS in tests."""

from __future__ import annotations

import datetime
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def certificate(subject, issuer, public_key, signing_key, *, ca: bool, dns: list[str]):
    """A day-long certificate for `dns` (its subjectAltNames), or a CA's."""
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if dns:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName(n) for n in dns]), critical=False
        )
    return builder.sign(signing_key, hashes.SHA256())


class TestCa:
    """A CA in `directory` (its certificate in `ca.pem`) that issues server certificates."""

    __test__ = False  # not a pytest test class

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._key = ec.generate_private_key(ec.SECP256R1())
        cert = certificate(
            name("Test CA"), name("Test CA"), self._key.public_key(), self._key, ca=True, dns=[]
        )
        self.ca_file = directory / "ca.pem"
        self.ca_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, *dns_names: str) -> Path:
        """A PEM file with the certificate for these names and its key."""
        key = ec.generate_private_key(ec.SECP256R1())
        cert = certificate(
            name(dns_names[0]), name("Test CA"), key.public_key(), self._key, ca=False,
            dns=list(dns_names),
        )  # fmt: skip
        cert_file = self.directory / f"{dns_names[0].replace('*', 'star')}.pem"
        cert_file.write_bytes(
            cert.public_bytes(serialization.Encoding.PEM)
            + key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        return cert_file
