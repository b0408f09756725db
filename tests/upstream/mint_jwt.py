#!/usr/bin/env python3
"""Mints JWTs and JWKS documents for the idemlog-proxy tests (Python standard library, and the
openssl command for RSA).

    mint_jwt.py KEY_FILE CLAIMS_JSON [ALG] [KID]   prints a token
    mint_jwt.py --jwks PEM KID                      prints a JWKS holding PEM's public RSA key

ALG is HS256 (default; KEY_FILE holds the secret, used without trailing whitespace, as the proxy
reads it), RS256 (KEY_FILE is a PEM private RSA key; signed with ``openssl dgst -sha256 -sign``) or
none (an unsigned token, which the proxy must refuse). KID, when given, goes in the token header.
In CLAIMS_JSON a claim "exp" is relative: a negative number means that many seconds ago, a
positive one that many seconds from now.
"""

import base64
import hashlib
import hmac
import json
import subprocess
import sys
import time


def b64(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def jwks(pem, kid):
    out = subprocess.run(
        ["openssl", "rsa", "-in", pem, "-noout", "-modulus"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    modulus = bytes.fromhex(out.strip().split("=", 1)[1])
    key = {"kty": "RSA", "kid": kid, "alg": "RS256", "use": "sig", "n": b64(modulus), "e": "AQAB"}
    print(json.dumps({"keys": [key]}))


def token(key_file, claims, alg, kid):
    now = int(time.time())
    if "exp" in claims:
        claims["exp"] = now + int(claims["exp"])
    claims.setdefault("iat", now)
    header = {"alg": alg, "typ": "JWT"}
    if kid:
        header["kid"] = kid
    signing_input = b64(json.dumps(header).encode()) + "." + b64(json.dumps(claims).encode())
    if alg == "none":
        signature = ""
    elif alg == "RS256":
        signed = subprocess.run(
            ["openssl", "dgst", "-sha256", "-sign", key_file],
            input=signing_input.encode(),
            check=True,
            capture_output=True,
        ).stdout
        signature = b64(signed)
    else:
        secret = open(key_file, "rb").read().rstrip()
        signature = b64(hmac.new(secret, signing_input.encode(), hashlib.sha256).digest())
    print(signing_input + "." + signature)


def main():
    if sys.argv[1] == "--jwks":
        jwks(sys.argv[2], sys.argv[3])
        return
    alg = sys.argv[3] if len(sys.argv) > 3 else "HS256"
    kid = sys.argv[4] if len(sys.argv) > 4 else None
    token(sys.argv[1], json.loads(sys.argv[2]), alg, kid)


if __name__ == "__main__":
    main()
