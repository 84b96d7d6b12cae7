"""A throwaway PKI for mTLS tests: a CA, the aggregator's server certificate and agent client
certificates whose CN (and optional DNS SANs) name a node.  Needs the ``cryptography`` package."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path


def make_pki(directory: Path, clients: dict[str, tuple[str, tuple[str, ...]]],
             ca_name: str = "fabricmon test CA") -> dict[str, tuple[str, str] | str]:
    """``clients``: stem -> (CN, DNS SANs).  Returns {"ca": path, "server": (key, cert), stem: (key, cert)}.
    Two CAs in one bundle (a rotation) need distinct ``ca_name``s: OpenSSL picks the issuer by name."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def builder(cn: str, issuer: x509.Name, pub) -> x509.CertificateBuilder:
        return (x509.CertificateBuilder().subject_name(name(cn)).issuer_name(issuer).public_key(pub)
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=1)))

    def write(stem: str, key, cert) -> tuple[str, str]:
        kp, cp = directory / f"{stem}.key", directory / f"{stem}.crt"
        kp.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                         serialization.NoEncryption()))
        cp.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return str(kp), str(cp)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (builder(ca_name, name(ca_name), ca_key.public_key())
               .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
               .sign(ca_key, hashes.SHA256()))
    out: dict = {"ca": write("ca", ca_key, ca_cert)[1]}

    def leaf(stem: str, cn: str, sans: list) -> None:
        k = ec.generate_private_key(ec.SECP256R1())
        b = (builder(cn, ca_cert.subject, k.public_key())
             .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True))
        if sans:
            b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        out[stem] = write(stem, k, b.sign(ca_key, hashes.SHA256()))

    leaf("server", "aggregator.test",
         [x509.DNSName("aggregator.test"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    for stem, (cn, dns) in clients.items():
        leaf(stem, cn, [x509.DNSName(d) for d in dns])
    return out
