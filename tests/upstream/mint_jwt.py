#!/usr/bin/env python3
"""Mints an HS256 JWT for the idemlog-proxy tests (Python standard library only).

    mint_jwt.py SECRET_FILE CLAIMS_JSON [ALG]

The secret is the file's bytes without trailing whitespace (as the proxy reads it). CLAIMS_JSON is
the payload; a claim "exp" given as a negative number means that many seconds ago, as a positive
number that many seconds from now. ALG is HS256 (default) or none (an unsigned token, which the
proxy must refuse). Prints the token on stdout.
"""

import base64
import hashlib
import hmac
import json
import sys
import time


def b64(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def main():
    secret = open(sys.argv[1], "rb").read().rstrip()
    claims = json.loads(sys.argv[2])
    alg = sys.argv[3] if len(sys.argv) > 3 else "HS256"
    now = int(time.time())
    if "exp" in claims:
        claims["exp"] = now + int(claims["exp"])
    claims.setdefault("iat", now)
    header = {"alg": alg, "typ": "JWT"}
    signing_input = b64(json.dumps(header).encode()) + "." + b64(json.dumps(claims).encode())
    if alg == "none":
        signature = ""
    else:
        signature = b64(hmac.new(secret, signing_input.encode(), hashlib.sha256).digest())
    print(signing_input + "." + signature)


if __name__ == "__main__":
    main()
