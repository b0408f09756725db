//! The scope from a bearer JWT the proxy verifies itself.
//!
//! Keys are read once at start-up: an HS256 secret (the whole file, trailing newline trimmed), or
//! the RS256/ES256 keys of a JWKS file (RFC 7517). A token is accepted only with an algorithm its
//! key allows (HS256 for the secret; RS256 or ES256 for JWKS keys, chosen by `kid` when the token
//! names one), a valid signature, an unexpired `exp`, and the configured `iss` and `aud`. The scope
//! is the configured claim, which must be a string; nothing else of the token is used.

use std::path::Path;

use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;
use idemlog_idempotency::Scope;
use jsonwebtoken::jwk::{JwkSet, KeyAlgorithm};
use jsonwebtoken::{Algorithm, DecodingKey, Validation, decode, decode_header};

use super::{ScopeError, check_scope};

/// Verification keys.
#[derive(Clone)]
pub enum JwtKeys {
    /// One HS256 secret.
    Hs256(DecodingKey),
    /// Keys of a JWKS file, with their `kid` and the algorithm each allows.
    Jwks(Vec<JwksKey>),
}

/// One key of a JWKS file.
#[derive(Clone)]
pub struct JwksKey {
    kid: Option<String>,
    algorithm: Algorithm,
    key: DecodingKey,
}

impl std::fmt::Debug for JwtKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Hs256(_) => f.write_str("Hs256(..)"),
            Self::Jwks(keys) => write!(f, "Jwks({} keys)", keys.len()),
        }
    }
}

impl JwtKeys {
    /// The HS256 secret in `path`.
    pub fn hs256_from_file(path: &Path) -> Result<Self, String> {
        let secret = std::fs::read(path)
            .map_err(|e| format!("could not read the JWT secret {}: {e}", path.display()))?;
        let secret = secret.trim_ascii_end();
        if secret.len() < 16 {
            return Err(format!(
                "the JWT secret in {} is {} bytes: use at least 16 (32 random bytes are usual)",
                path.display(),
                secret.len()
            ));
        }
        Ok(Self::Hs256(DecodingKey::from_secret(secret)))
    }

    /// The RS256 and ES256 keys of the JWKS file at `path`.
    pub fn jwks_from_file(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("could not read the JWKS file {}: {e}", path.display()))?;
        Self::jwks_from_str(&text).map_err(|e| format!("JWKS file {}: {e}", path.display()))
    }

    /// The RS256 and ES256 keys of a JWKS document.
    pub fn jwks_from_str(text: &str) -> Result<Self, String> {
        let set: JwkSet = serde_json::from_str(text).map_err(|e| format!("not a JWKS: {e}"))?;
        let mut keys = Vec::new();
        for jwk in &set.keys {
            let algorithm = match (&jwk.algorithm, jwk.common.key_algorithm) {
                (
                    jsonwebtoken::jwk::AlgorithmParameters::RSA(_),
                    None | Some(KeyAlgorithm::RS256),
                ) => Algorithm::RS256,
                (
                    jsonwebtoken::jwk::AlgorithmParameters::EllipticCurve(_),
                    None | Some(KeyAlgorithm::ES256),
                ) => Algorithm::ES256,
                // Other algorithms are not accepted: skip the key rather than trust it loosely.
                _ => continue,
            };
            let key = DecodingKey::from_jwk(jwk)
                .map_err(|e| format!("key {:?}: {e}", jwk.common.key_id))?;
            keys.push(JwksKey {
                kid: jwk.common.key_id.clone(),
                algorithm,
                key,
            });
        }
        if keys.is_empty() {
            return Err("no RS256 or ES256 key in the set".to_owned());
        }
        Ok(Self::Jwks(keys))
    }
}

/// Keys plus the checks a token must pass.
#[derive(Debug, Clone)]
pub struct JwtScope {
    keys: JwtKeys,
    claim: String,
    issuer: Option<String>,
    audience: Option<String>,
}

impl JwtScope {
    /// Verifies with `keys`, takes the scope from `claim`, checks `iss`/`aud` when given.
    pub fn new(
        keys: JwtKeys,
        claim: String,
        issuer: Option<String>,
        audience: Option<String>,
    ) -> Self {
        Self {
            keys,
            claim,
            issuer,
            audience,
        }
    }

    /// For the start-up log.
    pub fn describe(&self) -> String {
        let kind = match &self.keys {
            JwtKeys::Hs256(_) => "HS256 secret".to_owned(),
            JwtKeys::Jwks(keys) => format!("JWKS ({} RS256/ES256 keys)", keys.len()),
        };
        format!(
            "bearer JWT ({kind}), claim {:?}, issuer {:?}, audience {:?}",
            self.claim, self.issuer, self.audience
        )
    }

    fn validation(&self, algorithm: Algorithm) -> Validation {
        let mut v = Validation::new(algorithm);
        v.algorithms = vec![algorithm];
        v.leeway = 30;
        if let Some(iss) = &self.issuer {
            v.set_issuer(&[iss]);
        }
        match &self.audience {
            Some(aud) => v.set_audience(&[aud]),
            None => v.validate_aud = false,
        }
        v
    }

    /// The scope of a request with `Authorization: Bearer <jwt>`.
    pub fn scope_of(&self, headers: &HeaderMap) -> Result<Scope, ScopeError> {
        let Some(value) = headers.get(AUTHORIZATION) else {
            return Err(ScopeError::Missing("bearer token"));
        };
        let token = value
            .to_str()
            .ok()
            .and_then(|v| {
                let (scheme, token) = v.trim().split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            })
            .ok_or(ScopeError::Missing("bearer token"))?;
        let header =
            decode_header(token).map_err(|e| ScopeError::Invalid(format!("JWT header: {e}")))?;
        let (key, algorithm) = match &self.keys {
            JwtKeys::Hs256(key) => (key, Algorithm::HS256),
            JwtKeys::Jwks(keys) => {
                let found = keys.iter().find(|k| {
                    k.algorithm == header.alg
                        && match (&header.kid, &k.kid) {
                            (Some(want), Some(have)) => want == have,
                            (Some(_), None) => false,
                            (None, _) => true,
                        }
                });
                let k = found.ok_or_else(|| {
                    ScopeError::Invalid(format!(
                        "no key for kid {:?} and algorithm {:?}",
                        header.kid, header.alg
                    ))
                })?;
                (&k.key, k.algorithm)
            }
        };
        if header.alg != algorithm {
            return Err(ScopeError::Invalid(format!(
                "algorithm {:?} not accepted (expected {algorithm:?})",
                header.alg
            )));
        }
        let data = decode::<serde_json::Map<String, serde_json::Value>>(
            token,
            key,
            &self.validation(algorithm),
        )
        .map_err(|e| ScopeError::Invalid(format!("JWT: {e}")))?;
        let scope = match data.claims.get(&self.claim) {
            Some(serde_json::Value::String(s)) => s.as_str(),
            Some(_) => {
                return Err(ScopeError::Invalid(format!(
                    "claim {:?} is not a string",
                    self.claim
                )));
            }
            None => {
                return Err(ScopeError::Invalid(format!(
                    "claim {:?} is missing",
                    self.claim
                )));
            }
        };
        check_scope(scope).map_err(ScopeError::Invalid)?;
        Ok(Scope::new(scope))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{EncodingKey, Header, encode};

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn now() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs()
    }

    fn token(claims: serde_json::Value, secret: &[u8]) -> HeaderMap {
        let jwt = encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(secret),
        )
        .expect("encode");
        let mut h = HeaderMap::new();
        h.insert(
            AUTHORIZATION,
            format!("Bearer {jwt}").parse().expect("value"),
        );
        h
    }

    fn scope(issuer: Option<&str>, audience: Option<&str>) -> JwtScope {
        JwtScope::new(
            JwtKeys::Hs256(DecodingKey::from_secret(SECRET)),
            "sub".into(),
            issuer.map(str::to_owned),
            audience.map(str::to_owned),
        )
    }

    #[test]
    fn a_valid_hs256_token_gives_its_subject() {
        let h = token(
            serde_json::json!({"sub": "tenant-a", "exp": now() + 600}),
            SECRET,
        );
        assert_eq!(
            scope(None, None).scope_of(&h).expect("scope").as_str(),
            "tenant-a"
        );
    }

    #[test]
    fn a_wrong_signature_an_expired_token_or_wrong_issuer_is_refused() {
        let s = scope(Some("issuer-1"), Some("proxy"));
        let good =
            serde_json::json!({"sub": "t", "exp": now() + 600, "iss": "issuer-1", "aud": "proxy"});
        assert!(s.scope_of(&token(good.clone(), SECRET)).is_ok());
        assert!(
            s.scope_of(&token(good, b"another-secret-of-32-bytes......"))
                .is_err()
        );
        let expired =
            serde_json::json!({"sub": "t", "exp": now() - 3600, "iss": "issuer-1", "aud": "proxy"});
        assert!(s.scope_of(&token(expired, SECRET)).is_err());
        let other_iss =
            serde_json::json!({"sub": "t", "exp": now() + 600, "iss": "x", "aud": "proxy"});
        assert!(s.scope_of(&token(other_iss, SECRET)).is_err());
        let other_aud =
            serde_json::json!({"sub": "t", "exp": now() + 600, "iss": "issuer-1", "aud": "y"});
        assert!(s.scope_of(&token(other_aud, SECRET)).is_err());
    }

    #[test]
    fn a_missing_or_non_string_claim_is_refused() {
        let s = scope(None, None);
        assert!(matches!(
            s.scope_of(&HeaderMap::new()),
            Err(ScopeError::Missing(_))
        ));
        let numeric = serde_json::json!({"sub": 42, "exp": now() + 600});
        assert!(matches!(
            s.scope_of(&token(numeric, SECRET)),
            Err(ScopeError::Invalid(_))
        ));
    }

    fn jwks_scope() -> JwtScope {
        let keys = JwtKeys::jwks_from_str(include_str!("testdata/jwks.json")).expect("jwks");
        JwtScope::new(keys, "tenant".into(), Some("issuer-1".into()), None)
    }

    fn signed(alg: Algorithm, kid: Option<&str>, key: &EncodingKey, tenant: &str) -> HeaderMap {
        let mut header = Header::new(alg);
        header.kid = kid.map(str::to_owned);
        let claims = serde_json::json!({"tenant": tenant, "exp": now() + 600, "iss": "issuer-1"});
        let jwt = encode(&header, &claims, key).expect("encode");
        let mut h = HeaderMap::new();
        h.insert(
            AUTHORIZATION,
            format!("Bearer {jwt}").parse().expect("value"),
        );
        h
    }

    #[test]
    fn rs256_and_es256_tokens_verify_against_the_jwks_by_kid() {
        let s = jwks_scope();
        let rsa = EncodingKey::from_rsa_pem(include_bytes!("testdata/rs256-test-key.pem"))
            .expect("rsa key");
        let ec = EncodingKey::from_ec_pem(include_bytes!("testdata/es256-test-key.pem"))
            .expect("ec key");
        let a = signed(Algorithm::RS256, Some("rsa-1"), &rsa, "tenant-rsa");
        assert_eq!(s.scope_of(&a).expect("rs256").as_str(), "tenant-rsa");
        let b = signed(Algorithm::ES256, Some("ec-1"), &ec, "tenant-ec");
        assert_eq!(s.scope_of(&b).expect("es256").as_str(), "tenant-ec");
        // Without a kid, the key of the token's algorithm is found.
        let c = signed(Algorithm::ES256, None, &ec, "tenant-ec");
        assert!(s.scope_of(&c).is_ok());
        // A kid naming another key, or a key of another algorithm, is refused.
        let d = signed(Algorithm::RS256, Some("ec-1"), &rsa, "x");
        assert!(matches!(s.scope_of(&d), Err(ScopeError::Invalid(_))));
    }

    #[test]
    fn an_hs256_token_is_refused_by_a_jwks_source() {
        // The classic confusion: a token signed with HS256 using a key the verifier publishes.
        let s = jwks_scope();
        let hmac = EncodingKey::from_secret(b"secret-secret-secret-secret");
        let forged = signed(Algorithm::HS256, Some("hmac-1"), &hmac, "victim");
        assert!(matches!(s.scope_of(&forged), Err(ScopeError::Invalid(_))));
        let none_kid = signed(Algorithm::HS256, None, &hmac, "victim");
        assert!(s.scope_of(&none_kid).is_err());
    }

    #[test]
    fn a_jwks_without_usable_keys_is_refused() {
        assert!(JwtKeys::jwks_from_str(r#"{"keys": []}"#).is_err());
        assert!(JwtKeys::jwks_from_str("not json").is_err());
    }
}
