"""Users' OpenSSH public keys: a checked parse of one key line with ``cryptography``."""

from __future__ import annotations

import base64
import binascii
import struct
from dataclasses import dataclass

from bai_common.sshkeys import fingerprint

# Key types a user may register, and the least RSA size accepted.
KEY_TYPES = (
    "ssh-ed25519",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "ssh-rsa",
)
RSA_MIN_BITS = 2048
KEY_LINE_MAX = 16 * 1024


@dataclass(frozen=True)
class PublicKey:
    key_type: str
    blob: bytes
    comment: str
    bits: int

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.blob)

    @property
    def line(self) -> str:
        """The key as one authorized_keys line (type, base64, comment)."""
        data = base64.b64encode(self.blob).decode()
        return f"{self.key_type} {data} {self.comment}".rstrip()


def parse_public_key(text: str) -> PublicKey:
    """One OpenSSH public key line (``ssh-ed25519 AAAA... comment``), checked with
    ``cryptography``; ValueError says what is wrong in users' words."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

    if not isinstance(text, str):
        raise ValueError("a public key is text")
    if len(text) > KEY_LINE_MAX:
        raise ValueError(f"a public key line is at most {KEY_LINE_MAX} characters")
    text = text.strip()
    if "\n" in text or "\r" in text or "\x00" in text:
        raise ValueError("give one key on one line (as in id_ed25519.pub)")
    parts = text.split(None, 2)
    if len(parts) < 2:
        raise ValueError("not an OpenSSH public key: expected 'ssh-ed25519 AAAA... comment'")
    key_type, data = parts[0], parts[1]
    comment = parts[2] if len(parts) > 2 else ""
    if key_type not in KEY_TYPES:
        if key_type.startswith("-----") or "PRIVATE" in text:
            raise ValueError("that is a private key: give the public one (the .pub file)")
        raise ValueError(
            f"unsupported key type {key_type[:40]!r}; use one of {', '.join(KEY_TYPES)}"
        )
    try:
        blob = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("the key's data is not valid base64") from None
    if len(blob) < 4 or blob[4 : 4 + struct.unpack(">I", blob[:4])[0]] != key_type.encode():
        raise ValueError(f"the key's data does not hold a {key_type} key")
    try:
        key = serialization.load_ssh_public_key(f"{key_type} {data}".encode())
    except (ValueError, TypeError, struct.error) as exc:
        raise ValueError(f"not a valid {key_type} key ({exc})") from None
    if isinstance(key, rsa.RSAPublicKey):
        bits = key.key_size
        if bits < RSA_MIN_BITS:
            raise ValueError(f"an RSA key of {bits} bits is too weak; use at least {RSA_MIN_BITS}")
    elif isinstance(key, ec.EllipticCurvePublicKey):
        bits = key.curve.key_size
    elif isinstance(key, ed25519.Ed25519PublicKey):
        bits = 256
    else:  # pragma: no cover - load_ssh_public_key knows no other type of ours
        raise ValueError(f"unsupported key type {key_type!r}")
    return PublicKey(key_type, blob, comment, bits)
