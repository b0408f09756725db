//! Scopes in `idemlog-proxy`: a tenant never receives another tenant's response, even under the
//! same key with the same body, nor through another split of the same scope and key text. Scopes
//! from a trusted header and from a verified bearer JWT (HS256 secret or JWKS keys): the scope is
//! the claim, a token failing any check is 401, and neither tokens nor secrets reach the log.

use idemlog_e2e::proxy::*;
use idemlog_e2e::*;

#[test]
fn two_tenants_with_the_same_key_each_get_their_own_response() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-tenants");
    let proxy = Proxy::start(&upstream, dir.path(), &[]);
    let a = proxy.post(TENANT_A, "order-1", ORDER, "");
    let b = proxy.post(TENANT_B, "order-1", ORDER, "");
    assert_eq!((a.status, b.status), (201, 201), "{a:?} {b:?}");
    assert!(
        !b.replayed(),
        "tenant B is not replayed tenant A's answer: {b:?}"
    );
    assert_ne!(a.body, b.body);
    assert_eq!(upstream.runs("order-1"), 2, "one run per tenant");
    // Each replays its own.
    let a_again = proxy.post(TENANT_A, "order-1", ORDER, "");
    let b_again = proxy.post(TENANT_B, "order-1", ORDER, "");
    assert!(a_again.replayed() && b_again.replayed());
    assert_eq!(a_again.body, a.body);
    assert_eq!(b_again.body, b.body);
    // Another body under the same key is a mismatch only within the tenant that used it: for a
    // third tenant it is a new key, and for tenant A a 422.
    let c = proxy.post("tenant-c", "order-1", OTHER_ORDER, "");
    assert_eq!(c.status, 201, "{c:?}");
    let a_other = proxy.post(TENANT_A, "order-1", OTHER_ORDER, "");
    assert_eq!(a_other.status, 422, "{a_other:?}");
    assert_eq!(upstream.runs("order-1"), 3);
}

#[test]
fn a_tenant_waiting_on_its_own_key_is_not_blocked_by_another_tenants_run() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-tenants-concurrent");
    let proxy = std::sync::Arc::new(Proxy::start(&upstream, dir.path(), &[]));
    let slow = {
        let proxy = std::sync::Arc::clone(&proxy);
        std::thread::spawn(move || proxy.post(TENANT_A, "order-1", ORDER, "slow=1500"))
    };
    wait_until(std::time::Duration::from_secs(10), "tenant A's run", || {
        upstream.runs("order-1") == 1
    });
    // Tenant A's copy is in progress; tenant B's same key is not a copy of it.
    let b = proxy.post(TENANT_B, "order-1", ORDER, "");
    assert_eq!(b.status, 201, "{b:?}");
    let a_copy = proxy.post(TENANT_A, "order-1", ORDER, "");
    assert_eq!(a_copy.status, 409, "{a_copy:?}");
    let a = slow.join().expect("thread");
    assert_eq!(a.status, 201);
    assert_ne!(a.body, b.body);
    assert_eq!(upstream.runs("order-1"), 2);
}

#[test]
fn a_verified_bearer_jwt_is_the_scope_and_a_bad_one_is_401() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-jwt");
    let keys = TempDir::new("proxy-jwt-keys");
    let secret = write_config(keys.path(), "secret", "0123456789abcdef0123456789abcdef\n");
    let other_secret = write_config(keys.path(), "other", "fedcba9876543210fedcba9876543210");
    let secret_arg = secret.to_str().expect("utf-8 path");
    let proxy = Proxy::start_bare(
        &upstream.url(),
        dir.path(),
        &[
            "--jwt-hs256-secret-file",
            secret_arg,
            "--jwt-issuer",
            "shop-auth",
            "--jwt-audience",
            "shop-api",
        ],
    );
    let token = |secret: &std::path::Path, claims: &str, alg: &str| {
        format!("Bearer {}", mint_jwt(secret, claims, alg))
    };
    let post = |authorization: &str| {
        proxy.request(
            "POST",
            ORDERS,
            &[
                ("Authorization", authorization),
                ("Idempotency-Key", "order-1"),
                ("Content-Type", "application/json"),
            ],
            ORDER.as_bytes(),
        )
    };
    let claims = |sub: &str| {
        format!(r#"{{"sub": "{sub}", "iss": "shop-auth", "aud": "shop-api", "exp": 600}}"#)
    };
    let alice = token(&secret, &claims("alice"), "HS256");
    let bob = token(&secret, &claims("bob"), "HS256");
    let a = post(&alice);
    let b = post(&bob);
    assert_eq!((a.status, b.status), (201, 201), "{a:?} {b:?}");
    assert!(!b.replayed(), "bob is not replayed alice's answer");
    assert_eq!(upstream.runs("order-1"), 2);
    // A second token of alice (another iat) is the same scope: the scope is the claim, not the
    // token.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let alice_again = token(&secret, &claims("alice"), "HS256");
    assert_ne!(alice_again, alice);
    let replay = post(&alice_again);
    assert!(replay.replayed(), "{replay:?}");
    assert_eq!(replay.body, a.body);

    let refused = [
        (
            "another secret",
            token(&other_secret, &claims("alice"), "HS256"),
        ),
        (
            "another issuer",
            token(
                &secret,
                r#"{"sub": "alice", "iss": "evil", "aud": "shop-api", "exp": 600}"#,
                "HS256",
            ),
        ),
        (
            "another audience",
            token(
                &secret,
                r#"{"sub": "alice", "iss": "shop-auth", "aud": "other", "exp": 600}"#,
                "HS256",
            ),
        ),
        (
            "expired",
            token(
                &secret,
                r#"{"sub": "alice", "iss": "shop-auth", "aud": "shop-api", "exp": -3600}"#,
                "HS256",
            ),
        ),
        ("unsigned", token(&secret, &claims("alice"), "none")),
        ("not a JWT", "Bearer not-a-jwt".to_owned()),
    ];
    for (what, authorization) in &refused {
        let reply = post(authorization);
        assert_eq!(reply.status, 401, "{what}: {reply:?}");
        assert!(!reply.replayed(), "{what}");
    }
    let none = proxy.request(
        "POST",
        ORDERS,
        &[("Idempotency-Key", "order-1")],
        ORDER.as_bytes(),
    );
    assert_eq!(none.status, 401, "no token: {none:?}");
    assert_eq!(upstream.runs("order-1"), 2, "no refused request ran");
    // Neither the tokens nor the secret are written to the log.
    std::thread::sleep(std::time::Duration::from_millis(200));
    let logs = proxy.logs().join("\n");
    for token in [&alice, &bob, &alice_again] {
        let signature = token.rsplit('.').next().expect("a signature");
        assert!(
            !logs.contains(signature),
            "a bearer token in the log:\n{logs}"
        );
    }
    assert!(!logs.contains("0123456789abcdef"), "the secret in the log");
}

#[test]
fn a_bearer_jwt_verified_by_a_jwks_key_is_the_scope() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-jwks");
    let keys = TempDir::new("proxy-jwks-keys");
    let key = rsa_key(keys.path(), "key.pem");
    let stranger = rsa_key(keys.path(), "stranger.pem");
    let public = rsa_public_pem(&key, &keys.path().join("public.pem"));
    let jwks = write_config(keys.path(), "jwks.json", &jwks_of(&key, "k1"));
    let proxy = Proxy::start_bare(
        &upstream.url(),
        dir.path(),
        &[
            "--jwt-jwks-file",
            jwks.to_str().expect("utf-8 path"),
            "--jwt-claim",
            "tenant",
        ],
    );
    let post = |token: &str| {
        proxy.request(
            "POST",
            ORDERS,
            &[
                ("Authorization", &format!("Bearer {token}")),
                ("Idempotency-Key", "order-1"),
                ("Content-Type", "application/json"),
            ],
            ORDER.as_bytes(),
        )
    };
    let claims = |tenant: &str| format!(r#"{{"sub": "user-1", "tenant": "{tenant}", "exp": 600}}"#);
    let acme = post(&mint_rs256_jwt(&key, &claims("acme"), "k1"));
    let globex = post(&mint_rs256_jwt(&key, &claims("globex"), "k1"));
    assert_eq!(
        (acme.status, globex.status),
        (201, 201),
        "{acme:?} {globex:?}"
    );
    assert!(!globex.replayed(), "the scope is the tenant claim, not sub");
    let again = post(&mint_rs256_jwt(&key, &claims("acme"), "k1"));
    assert!(again.replayed(), "{again:?}");
    assert_eq!(again.body, acme.body);
    assert_eq!(upstream.runs("order-1"), 2);

    let refused = [
        (
            "another key under the same kid",
            mint_rs256_jwt(&stranger, &claims("acme"), "k1"),
        ),
        (
            "an unknown kid",
            mint_rs256_jwt(&key, &claims("acme"), "k2"),
        ),
        // The public key used as an HMAC secret: the classic algorithm confusion.
        (
            "HS256 with the public key",
            mint_jwt(&public, &claims("acme"), "HS256"),
        ),
        ("unsigned", mint_jwt(&public, &claims("acme"), "none")),
        (
            "no tenant claim",
            mint_rs256_jwt(&key, r#"{"sub": "user-1", "exp": 600}"#, "k1"),
        ),
    ];
    for (what, token) in &refused {
        let reply = post(token);
        assert_eq!(reply.status, 401, "{what}: {reply:?}");
    }
    assert_eq!(upstream.runs("order-1"), 2, "no refused request ran");
}

#[test]
fn a_scope_and_key_pair_never_collides_with_another_split_of_the_same_text() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-scope-split");
    let proxy = Proxy::start(&upstream, dir.path(), &[]);
    // If scope and key were joined into one string, ("t:x", "k") and ("t", "x:k") would be one
    // record, and one tenant would be handed the other's response.
    for sep in [
        ":", "/", "|", ",", ".", "-", "_", "#", "@", "=", "\\", "%3A",
    ] {
        let key_a = "k".to_owned();
        let tenant_a = format!("t{sep}x");
        let key_b = format!("x{sep}k");
        let first = proxy.post(&tenant_a, &key_a, ORDER, "");
        let second = proxy.post("t", &key_b, ORDER, "");
        assert_eq!(first.status, 201, "{sep:?}: {first:?}");
        assert_eq!(second.status, 201, "{sep:?}: {second:?}");
        assert!(
            !second.replayed() && second.body != first.body,
            "{sep:?}: tenant \"t\" got tenant {tenant_a:?}'s response"
        );
    }
}
